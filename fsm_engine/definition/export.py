"""Plain-dict export of a machine definition and its fingerprint.

The export is the single source for diagrams and for the fingerprint stored
with every instance, so a structural change (a state, a transition, a guard,
a policy, the context schema) changes the fingerprint, while editing the body
of an action does not.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .kind import Site, kinds_of
from .refs import as_refs, ref_name
from .timers import export as timer_export

if TYPE_CHECKING:
    from .spec import Machine, State


def _state_dict(machine: Machine, s: State) -> dict[str, Any]:
    """One state's export: its fields, then its kind's entries (``StateKind.export``:
    ``review``, ``fan_out``, ``agent``, a plug-in's ``kind``; a wait's is its ``wait``)."""
    out = {
        "name": s.name, "final": s.final, "failure": s.failure, "wait": s.wait,
        "action": ref_name(s.action), "timeout": s.timeout,
        "retry": asdict(s.retry) if s.retry else None, "fallback": s.fallback,
        "side_effect": s.side_effect, "skippable": s.skippable,
        "description": s.description,
    }
    for key in ("llm", "repair_llm", "token_budget", "on_exhausted"):  # only when set: old fingerprints hold
        if getattr(s, key) is not None:
            out[key] = getattr(s, key)
    if s.queue != "default":  # only when set: old fingerprints hold
        out["queue"] = s.queue
    if s.cache is not None:
        out["cache"] = {"ttl_s": s.cache.ttl_s}
    site = Site(machine, s, export_of=export_machine)
    for kind in kinds_of(s):  # review, fan_out, agent, a plug-in's kind (``definition.kind``)
        out.update(kind.export(site))
    return out


def export_machine(machine: Machine) -> dict[str, Any]:
    """Return ``{"name", "initial", "max_transitions", "token_budget", "states", "transitions"}``.

    ``transitions`` has one entry per (source, trigger, dest) with guard names
    in ``conditions`` / ``unless``; fallback transitions have trigger ``fallback``; a
    timer edge has ``after``: seconds, or ``"callable:NAME"``.
    """
    names = [s.name for s in machine.states]
    transitions = [
        {"trigger": t.trigger, "source": src, "dest": t.dest,
         "conditions": [ref_name(g) for g in as_refs(t.conditions)],
         "unless": [ref_name(g) for g in as_refs(t.unless)],
         # only on a timer edge: old fingerprints hold
         **({} if t.after is None else {"after": timer_export(t.after)})}
        for t in machine.all_transitions() for src in t.sources(names, machine.finals)
    ]
    out = {
        "name": machine.name, "initial": machine.initial,
        "max_transitions": machine.max_transitions, "token_budget": machine.token_budget,
        "states": [_state_dict(machine, s) for s in machine.states], "transitions": transitions,
    }
    for key in ("on_loop_limit", "on_circuit_open",
                "on_retries_exhausted"):  # only when set: fingerprints stay
        if getattr(machine, key) is not None:
            out[key] = getattr(machine, key)
    return out


def fingerprint(machine: Machine) -> str:
    """SHA-256 (first 16 hex digits) of the export plus the context's JSON Schema."""
    exported = export_machine(machine)
    for state in exported["states"]:
        del state["description"]  # prose: not structure
    doc = {"machine": exported,
           "context": machine.context.model_json_schema()}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
