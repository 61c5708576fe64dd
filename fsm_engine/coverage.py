"""Coverage of a machine: which states, transitions, guard outcomes and policy exits runs
have exercised (``fsm coverage``, ``fsm test``, ``pytest --fsm-coverage``).

Computed from history rows alone (any store, production or test), against the
definition's plain-dict export (``Machine.export()``):

* a state is **entered** once per instance started in the initial state and once per
  history row moving to it (takeovers and migrations are not moves; a ``cancel`` row
  stays where it is);
* an **edge** is a declared transition, one per (source, trigger, dest, guards) as the
  diagrams draw it; a row takes the edge whose guards it passed.  The guards a row lists
  (``[name, result]`` in evaluation order) are walked over the source's transitions in
  the order the runtime tries them (``CompiledMachine.choose``), which says for each
  result the transition it was evaluated for; a row the walk cannot explain (a changed
  definition) counts for the first edge with its (source, trigger, dest), guards unseen;
* a **timer edge** (``after=``) counts like any edge: its fire's row (``kind: timer``)
  takes it;
* a **guard outcome** is (edge, guard, True/False: what the guard function returned, also
  for an ``unless`` guard ``!g``, which passes on False); a guard with one outcome seen
  is *one-sided*;
* a **policy exit** is a row's way out of a failed action, per state: ``fallback``,
  ``skip``, ``retries_exhausted``, ``timeout``, ``token_budget``, ``loop_limit``,
  ``circuit_open``, ``deadline``, ``review_timeout`` (a review decided by its SLA
  timer), ``error`` (a failure without a policy), ``no_transition``;
* ``percent`` is the share of declared edges taken (the figure ``--fail-under``
  checks); states, guard outcomes and exits are reported beside it.

Fan-out branch machines are machines of their own (their instances are the children):
a parent's coverage counts the parent's rows only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .store import details
from .store.records import NOT_MOVES, HistoryRow

__all__ = ["Coverage", "Edge", "collect", "from_store", "verdict", "EXITS"]

#: Policy exits in report order (see the module docstring).
EXITS = ("fallback", "skip", "retries_exhausted", "timeout", "token_budget", "loop_limit",
         "circuit_open", "deadline", "review_timeout", "no_transition", "error")
_RESERVED = frozenset({"fallback", "budget_exhausted"})
_SLA = "sla-timer"  # runtime.kinds.reviews.SLA: the decider of a review its timer decided


@dataclass(frozen=True)
class Edge:
    """A declared edge: its (source, trigger, dest) and guard names (``!g``: unless)."""

    source: str
    trigger: str
    dest: str
    guards: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``source --trigger [g, !h]--> dest``."""
        guards = f" [{', '.join(self.guards)}]" if self.guards else ""
        return f"{self.source} --{self.trigger}{guards}--> {self.dest}"


@dataclass
class Coverage:
    """What runs of one machine exercised (counts; see the module docstring)."""

    machine: str
    instances: int = 0
    states: dict[str, int] = field(default_factory=dict)
    edges: dict[Edge, int] = field(default_factory=dict)
    guards: dict[tuple[Edge, str], Counter[bool]] = field(default_factory=dict)
    exits: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Moves matching no declared edge (runtime-forced: fail, cancel, loop_limit …).
    forced: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: Exits the definition makes possible, per state (``retry`` → retries_exhausted …).
    possible: set[tuple[str, str]] = field(default_factory=set)
    #: Each instance's declared edges in order (``fsm paths`` marks the paths seen).
    paths: Counter[tuple[Edge, ...]] = field(default_factory=Counter)

    @property
    def percent(self) -> float:
        """Edges taken / edges declared, in percent (100.0 for a machine without edges)."""
        if not self.edges:
            return 100.0
        return 100.0 * sum(1 for n in self.edges.values() if n) / len(self.edges)

    def one_sided(self) -> list[tuple[Edge, str, bool]]:
        """(edge, guard, the only outcome seen) for each guard seen one way only."""
        return [(e, g, next(iter(c))) for (e, g), c in self.guards.items() if len(+c) == 1]

    def unseen_guards(self) -> list[tuple[Edge, str]]:
        """(edge, guard) for guards never evaluated."""
        return [(e, g) for (e, g), c in self.guards.items() if not +c]

    def to_json(self) -> dict[str, Any]:
        """A plain-JSON view (``--json``): counts, percentages and what is missing."""
        return {
            "machine": self.machine, "instances": self.instances,
            "percent": round(self.percent, 2),
            "states": self.states,
            "unreached_states": [s for s, n in self.states.items() if not n],
            "edges": [{"source": e.source, "trigger": e.trigger, "dest": e.dest,
                       "guards": list(e.guards), "taken": n} for e, n in self.edges.items()],
            "guards": [{"edge": e.label, "guard": g, "true": c[True], "false": c[False]}
                       for (e, g), c in self.guards.items()],
            "exits": [{"state": s, "exit": x, "count": n} for (s, x), n in sorted(self.exits.items())],
            "unseen_exits": [{"state": s, "exit": x} for s, x in sorted(self.possible)
                             if not self.exits[(s, x)]],
            "forced": [{"source": s, "dest": d, "trigger": t, "count": n}
                       for (s, d, t), n in sorted(self.forced.items())],
        }

    def merge(self, other: Coverage) -> Coverage:
        """Add ``other``'s counts (same machine) into this one; return self."""
        self.instances += other.instances
        for name, n in other.states.items():
            self.states[name] = self.states.get(name, 0) + n
        for edge, n in other.edges.items():
            self.edges[edge] = self.edges.get(edge, 0) + n
        for key, c in other.guards.items():
            self.guards.setdefault(key, Counter()).update(c)
        self.exits.update(other.exits)
        self.forced.update(other.forced)
        self.possible |= other.possible
        self.paths.update(other.paths)
        return self


def verdict(guard: str, result: bool) -> str:
    """What a guard's ``result`` meant for its edge: ``passed`` or ``refused`` (an
    ``unless`` guard, ``!g``, passes on False)."""
    return "passed" if result is not guard.startswith("!") else "refused"


# -- the definition's shape ---------------------------------------------------------
def _edge_of(t: Mapping[str, Any]) -> Edge:
    guards = tuple(str(c) for c in t.get("conditions") or ())
    guards += tuple(f"!{u}" for u in t.get("unless") or ())
    return Edge(str(t["source"]), str(t["trigger"]), str(t["dest"]), guards)


class _Plan:
    """The export's transitions per source in the order ``choose`` tries them."""

    def __init__(self, export: Mapping[str, Any]) -> None:
        self.by_source: dict[str, list[Edge]] = {}
        for t in export.get("transitions", ()):
            self.by_source.setdefault(str(t["source"]), []).append(_edge_of(t))

    def candidates(self, source: str, trigger: str | None) -> list[Edge]:
        """``choose``'s order: with ``trigger`` its transitions; without, every
        non-reserved trigger in first-declared order, each trigger's transitions in turn."""
        edges = self.by_source.get(source, [])
        if trigger is not None:
            return [e for e in edges if e.trigger == trigger]
        order = list(dict.fromkeys(e.trigger for e in edges if e.trigger not in _RESERVED))
        return [e for trig in order for e in edges if e.trigger == trig]


def _possible(export: Mapping[str, Any]) -> set[tuple[str, str]]:
    """Exits the definition declares: per state its retry, timeout, fallback, skip,
    budget edge and review SLA (the loop cap, the breaker and the deadline may stop any
    state: they are counted when seen, not listed as missing)."""
    out: set[tuple[str, str]] = set()
    triggers = {(str(t["source"]), str(t["trigger"])) for t in export.get("transitions", ())}
    for s in export.get("states", ()):
        name = str(s["name"])
        review = s.get("review") or {}
        checks = (("retries_exhausted", bool(s.get("retry"))),
                  ("timeout", s.get("timeout") is not None),
                  ("fallback", (name, "fallback") in triggers),
                  ("skip", bool(s.get("skippable"))),
                  ("token_budget", (name, "budget_exhausted") in triggers),
                  ("review_timeout", review.get("sla_s") is not None))
        out |= {(name, exit_) for exit_, declared in checks if declared}
    return out


# -- one row --------------------------------------------------------------------------
def _walk(candidates: Sequence[Edge], log: Sequence[Sequence[Any]]
          ) -> tuple[bool, Edge | None, list[tuple[Edge, str, bool]]]:
    """Replay ``choose`` over ``candidates`` with the logged guard results: (whether the
    log fits exactly, the edge chosen or None, each bool outcome with its edge)."""
    pos = 0
    seen: list[tuple[Edge, str, bool]] = []
    for edge in candidates:
        passed = True
        for guard in edge.guards:
            if pos >= len(log) or log[pos][0] != guard:
                return False, None, seen
            result = log[pos][1]
            pos += 1
            if result is not True and result is not False:  # a guard that returned junk
                return pos == len(log), None, seen
            seen.append((edge, guard, result))
            if result is guard.startswith("!"):  # an unless guard passes on False
                passed = False
                break
        if passed:
            return pos == len(log), edge, seen
    return pos == len(log), None, seen


def _attribute(plan: _Plan, row: HistoryRow
               ) -> tuple[Edge | None, list[tuple[Edge, str, bool]]]:
    """The declared edge ``row`` took (None: a forced move) and its guard outcomes."""
    log = [g for g in row.guards if isinstance(g, (list, tuple)) and len(g) == 2]
    moved = row.kind in ("transition", "fallback", "skip", "review", "join", "timer")
    hypotheses: list[str | None] = [None, row.trigger] if row.kind in ("transition", "skip") \
        else [row.trigger] if moved else [None]  # a failure records no trigger it tried
    for trigger in hypotheses:
        fits, chosen, seen = _walk(plan.candidates(row.source, trigger), log)
        if fits and (chosen is None) == (not moved) and (
                chosen is None or (chosen.trigger, chosen.dest) == (row.trigger, row.dest)):
            return chosen, seen
    if moved:  # the log does not fit this definition: the edge by its move alone
        for edge in plan.by_source.get(row.source, []):
            if (edge.trigger, edge.dest) == (row.trigger, row.dest):
                return edge, []
    return None, []


def _exits(row: HistoryRow) -> list[str]:
    """The policy exits ``row`` records: its kind's (a fallback, a skip, the loop cap, a
    review its SLA timer decided) and its reason's (``fallback`` after ``timeout`` is both)."""
    out = [row.kind] if row.kind in ("fallback", "skip", "loop_limit") else []
    if row.kind == "review" and details.reviewer(row.detail) == _SLA:
        out.append("review_timeout")
    if row.reason in EXITS and row.reason not in out:
        out.append(row.reason)
    if not out and row.kind == "fail" and row.error:
        out.append("error")
    return out


# -- many rows ------------------------------------------------------------------------
def collect(export: Mapping[str, Any], histories: Iterable[Sequence[HistoryRow]]) -> Coverage:
    """The coverage of ``export`` by these instances' histories (each ordered by seq)."""
    plan = _Plan(export)
    cov = Coverage(str(export.get("name", "")))
    cov.states = {str(s["name"]): 0 for s in export.get("states", ())}
    cov.edges = {e: 0 for edges in plan.by_source.values() for e in edges}
    cov.guards = {(e, g): Counter() for e in cov.edges for g in e.guards}
    cov.possible = _possible(export)
    initial = str(export.get("initial"))
    for history in histories:
        cov.instances += 1
        cov.states[initial] = cov.states.get(initial, 0) + 1
        walked: list[Edge] = []
        for row in history:
            if row.kind not in NOT_MOVES:
                edge = _count(cov, plan, row)
                if edge is not None:
                    walked.append(edge)
        cov.paths[tuple(walked)] += 1
    return cov


def _count(cov: Coverage, plan: _Plan, row: HistoryRow) -> Edge | None:
    """Count ``row`` into ``cov``; the declared edge it took (None: forced)."""
    edge, seen = _attribute(plan, row)
    for e, guard, result in seen:
        cov.guards.setdefault((e, guard), Counter())[result] += 1
    if edge is not None:
        cov.edges[edge] = cov.edges.get(edge, 0) + 1
    elif row.kind != "cancel" or row.source != row.dest:
        cov.forced[(row.source, row.dest, row.trigger)] += 1
    if row.kind != "cancel":
        cov.states[row.dest] = cov.states.get(row.dest, 0) + 1
    for exit_ in _exits(row):
        cov.exits[(row.source, exit_)] += 1
    return edge


def from_store(store: Any, export: Mapping[str, Any]) -> Coverage:
    """The coverage of ``export`` by every instance of its machine (by name) in
    ``store``."""
    records = store.list(machine=str(export.get("name")))
    return collect(export, (store.history(r.id) for r in records))
