"""The fan-out kind as the definition layer sees it (``FAN_OUT``, on the
``definition.kind.StateKind`` protocol): its checks, its export entry, its diagram notes.

``problems(parent, state, machine_problems)`` lists what is wrong with ``state``'s
``Parallel`` or ``Map``: the state itself (no action, a ``joined`` transition, the
``items`` / ``into`` fields, the reducer, ``max_concurrency``, the completion policy)
and each branch (``default_output``, ``item_field``, and every problem of its machine,
found by ``machine_problems``: ``check`` passes its own, so a branch machine is checked
as a whole machine without this module importing ``check``; so does ``export`` its
export, for the branch machines' exports).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .fanout import JOINED, BranchPlan, Map, Parallel, completion_of
from .refs import ref_name

if TYPE_CHECKING:
    from .kind import Site
    from .spec import Machine, State


def problems(parent: Machine, state: State,
             machine_problems: Callable[[Machine], list[str]]) -> list[str]:
    """What is wrong with ``state``'s fan-out, each problem naming the state and branch;
    ``machine_problems(m)`` gives every problem of a branch machine ``m`` (``[]``: none)."""
    fo, where = state.fan_out, f"state {state.name!r}"
    if not isinstance(fo, (Parallel, Map)):
        return [f"{where}: fan_out must be a Parallel or a Map"]
    out = [f"{where}: {p}" for p in _shape_problems(parent, state, fo)]
    for plan in parent.branch_plans(state):
        label = f"{where}: branch {plan.name!r}" if plan.name else f"{where}: map branch"
        out += [f"{label}{p}" for p in _branch_problems(fo, plan, machine_problems)]
    return out


def _shape_problems(parent: Machine, state: State, fo: Parallel | Map) -> list[str]:
    """The fan-out state itself: its kind, its join transition, fields, reducer, limits."""
    out: list[str] = []
    if state.action is not None or state.wait or state.final:
        out.append("a fan-out state has no action, is not a wait state, not final")
    if not any(t.trigger == JOINED and state.name in t.sources([state.name])
               for t in parent.transitions):
        out.append(f"a fan-out state needs a {JOINED!r} transition")
    fields = parent.context.model_fields if isinstance(parent.context, type) else {}
    if isinstance(fo, Map) and fo.items not in fields:
        out.append(f"items field {fo.items!r} is not a context field")
    if fo.into is not None and fo.into not in fields:
        out.append(f"into field {fo.into!r} is not a context field")
    if fo.into is None and fo.reducer is None:
        out.append("name an `into` context field or a reducer returning updates")
    if fo.reducer is not None and not callable(fo.reducer):
        out.append("reducer must be callable")
    if fo.max_concurrency is not None and fo.max_concurrency < 1:
        out.append("max_concurrency must be >= 1")
    out += list(completion_of(fo).problems())
    if isinstance(fo, Parallel):
        if not fo.branches:
            out.append("a Parallel needs at least one branch")
        out += ["branch names must be non-empty strings"
                for n in fo.branches if not (isinstance(n, str) and n)][:1]
    return out


def _branch_problems(fo: Parallel | Map, plan: BranchPlan,
                     machine_problems: Callable[[Machine], list[str]]) -> list[str]:
    """One branch's machine, each problem starting with ``": "`` or ``" (machine ...): "``."""
    out: list[str] = []
    if plan.spec.skippable and plan.spec.default_output is None:
        out.append(": skippable needs a default_output")
    if isinstance(fo, Map) and fo.item_field is not None and \
            fo.item_field not in plan.machine.context.model_fields:
        out.append(f": item_field {fo.item_field!r} is not a field of "
                   f"{plan.machine.context.__name__}")
    out += [f" (machine {plan.machine.name!r}): {p}" for p in machine_problems(plan.machine)]
    return out


class FanOutKind:
    """``State(fan_out=Parallel(...) | Map(...))`` on the ``StateKind`` protocol."""

    name, waits = "fan_out", True

    def matches(self, state: State) -> bool:
        return state.fan_out is not None

    def parks(self, state: State) -> bool:
        return False

    def calls_model(self, state: State) -> bool:
        return False

    def problems(self, site: Site) -> list[str]:
        assert site.problems_of is not None
        return problems(site.machine, site.state, site.problems_of)

    def export(self, site: Site) -> dict[str, Any]:
        """Its shape: kind, items, policy, and each branch machine's export."""
        fo, export_of = site.state.fan_out, site.export_of
        assert fo is not None and export_of is not None
        policy = completion_of(fo)
        return {"fan_out": {
            "kind": "map" if isinstance(fo, Map) else "parallel",
            "items": fo.items if isinstance(fo, Map) else None,
            "into": fo.into, "reducer": ref_name(fo.reducer),
            "completion": {k: v for k, v in asdict(policy).items() if v is not None},
            "max_concurrency": fo.max_concurrency,
            "branches": [{"name": p.name, "wrapped": p.wrapped, "skippable": p.spec.skippable,
                          "machine": export_of(p.machine)}
                         for p in site.machine.branch_plans(site.state)],
        }}

    def notes(self, exported: Mapping[str, Any]) -> list[str]:
        """``map over items`` / ``parallel ×N``, the completion rule, the concurrency cap."""
        fan = exported.get("fan_out")
        if not fan:
            return []
        mode = fan["completion"].get("mode", "all_successful")
        notes = [f"map over {fan['items']}" if fan["kind"] == "map"
                 else f"parallel ×{len(fan['branches'])}",
                 mode + "".join(f" {v}" for k, v in fan["completion"].items() if k != "mode")]
        if fan.get("max_concurrency"):
            notes.append(f"≤{fan['max_concurrency']} at once")
        return notes


FAN_OUT = FanOutKind()
