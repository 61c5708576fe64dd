"""Replay a stored instance's recorded steps through a (changed) definition, in memory.

Nothing runs but the guards: each recorded step's outcome (its context delta, the
action's recorded update) is applied to the recorded context before it, and the
definition chooses the transition as the runtime would.  No action, model call or
side effect runs and nothing is written.  The report names the first step whose
transition differs, every step whose guard results differ, and the states the
history names that the definition no longer has.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from pydantic import ValidationError

from ..store.records import HistoryRow, InstanceRecord
from .compiled import CompiledMachine

#: Recorded kinds whose transition the definition chose (forced moves are not replayed).
_CHOSEN = frozenset({"transition", "fallback", "skip", "review"})


@dataclass
class Replay:
    """What a replay found; ``identical`` when nothing differs.

    ``divergence``: ``{seq, source, recorded: [trigger, dest], now: [trigger, dest] | None,
    why}`` of the first step that goes elsewhere; ``guards``: ``{seq, recorded, now}`` per
    step whose guard results differ; ``missing_states``: ``{seq, state}`` per state the
    history names that the definition lacks (first mention each).
    """

    instance_id: str
    steps: int
    divergence: dict[str, Any] | None = None
    guards: list[dict[str, Any]] = field(default_factory=list)
    missing_states: list[dict[str, Any]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.divergence is None and not self.guards and not self.missing_states

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"identical": self.identical}


def _missing(cm: CompiledMachine, history: Sequence[HistoryRow]) -> list[dict[str, Any]]:
    seen: dict[str, int] = {}
    for h in history:
        for name in (h.source, h.dest):
            if name not in cm.states and name not in seen:
                seen[name] = h.seq
    return [{"seq": seq, "state": name} for name, seq in seen.items()]


def _choose(cm: CompiledMachine, h: HistoryRow, obj: Any, run: tuple[Any, ...]) -> Any:
    """The definition's choice for recorded row ``h``: free selection first; a forced or
    fired trigger (fallback, skip, a review's choice, an action's ``fire``) when only
    that reproduces the recorded move."""
    free = cm.choose(h.source, obj, run)
    if h.kind == "transition" and free is not None and (free.trigger, free.dest) == (h.trigger, h.dest):
        return free
    if cm.has_trigger(h.source, h.trigger):
        forced = cm.choose(h.source, obj, run, h.trigger)
        if forced is not None and (h.kind != "transition" or forced.guards == h.guards):
            return forced
    return free


def replay(cm: CompiledMachine, rec: InstanceRecord, history: Sequence[HistoryRow]) -> Replay:
    """Replay ``rec``'s ``history`` through ``cm`` (pure; guards are evaluated)."""
    out = Replay(rec.id, len(history), missing_states=_missing(cm, history))
    ctx, loops, tokens = dict(rec.input), 0, 0
    for h in history:
        before = ctx
        ctx = {**ctx, **h.delta}
        tokens += h.tokens
        if h.kind not in _CHOSEN:
            continue
        loops += 1
        if h.source not in cm.states:
            out.divergence = {"seq": h.seq, "source": h.source, "recorded": [h.trigger, h.dest],
                              "now": None, "why": f"state {h.source!r} no longer exists"}
            break
        try:
            obj = cm.spec.context.model_validate({**before, **h.delta})
        except ValidationError as exc:
            out.divergence = {"seq": h.seq, "source": h.source, "recorded": [h.trigger, h.dest],
                              "now": None, "why": "the recorded context fails the context "
                              f"model: {exc.errors()[0]['msg']}"}
            break
        run = (rec.id, h.source, loops - 1, rec.max_transitions, tokens, rec.token_budget)
        try:
            choice = _choose(cm, h, obj, run)
        except Exception as exc:  # noqa: BLE001 - a guard raising is a finding, not a crash
            choice, why = None, f"a guard raised {type(exc).__name__}: {exc}"
        else:
            why = "no transition passes its guards" if choice is None else "another transition"
        if choice is not None and [list(g) for g in choice.guards] != [list(g) for g in h.guards]:
            out.guards.append({"seq": h.seq, "recorded": h.guards, "now": choice.guards})
        if choice is None or (choice.trigger, choice.dest) != (h.trigger, h.dest):
            now = None if choice is None else [choice.trigger, choice.dest]
            out.divergence = {"seq": h.seq, "source": h.source, "recorded": [h.trigger, h.dest],
                              "now": now, "why": why}
            break
    return out
