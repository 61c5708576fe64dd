"""Statistics over many instances: the numbers behind ``fsm stats`` and the viewer.

:func:`machine_stats` reads only through the store's read side (``count``
and ``steps``: filtered by the backend, history streamed in batches without
its JSON payloads) and returns one :class:`MachineStats` per machine.

Definitions (units in the field names: ``_ms`` milliseconds, ``_s`` seconds):

* a state is **entered** by each history row going to it and by each instance
  whose first row leaves it (it started there); its **steps** are the history
  rows leaving it; ``tokens`` and
  ``action_ms`` are those rows' tokens and action durations; ``wall_s`` is the
  time from entering the state (the previous row, or the instance's creation)
  to leaving it: retries, backoff and waiting for a turn included;
* ``retries`` counts failed attempts before a step (``attempt - 1``);
  ``fallbacks`` the steps of kind ``fallback``; ``reasks`` the structured-output
  re-asks; ``errors`` the steps that carry an error; ``recoveries`` the takeovers
  by another worker while the instance stood in the state (history rows of kind
  ``recovery``: not steps, moves or edges; time spent before one counts in the
  step that follows it);
* an **edge** is a (source, trigger, dest, kind) move; ``taken`` counts rows,
  ``instances`` the distinct instances that took it;
* ``fallback_rate`` / ``reask_rate``: the share of instances with history that
  took at least one fallback / made at least one re-ask;
* per instance, ``tokens`` sums its history rows' tokens (tokens billed by failed
  attempts are in ``fsm show``) and ``wall_s`` runs from creation to its last
  row, for final instances only;
* **tokens are counted where the call was made**: a fan-out parent's join row
  brings its children's tokens into the parent's ``tokens_used`` (the family's
  budget), but the figures here leave them out of the parent's row
  (``detail.children_tokens``) and count them once, in the rows of the child that
  called the model (its machine's figures).  So the tokens of every machine add up
  to the tokens spent, and a parent's own figures are its own calls;
* ``sources``: for each top-level context field named ``*_source`` (e.g. the
  moderation machine's ``verdict_source``), instances per value;
* ``tools``: per tool of an agent state, its ``calls`` (history rows of kind ``tool``
  journaling a call), the ``errors`` among them (an exception, a timeout, bad output,
  an unknown tool or invalid arguments: results the model saw as errors) and their
  ``duration_ms``; an agent's model turns are rows of kind ``tool`` too, so their tokens
  count in the instance's ``tokens``;
* percentiles are nearest-rank: ``p95`` is the smallest value with at least
  95 % of the values at or below it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .store.base import Store
from .store.records import FINAL_STATUSES, NOT_MOVES, RECOVERY, TOOL, InstanceFilter, StepRow

#: Triggers of an agent's journal rows that are not tool calls (``runtime.kinds.agent_journal``).
_NOT_CALLS = frozenset({"turn", "ask", "decision"})


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank ``p``-th percentile (0 < p <= 100) of sorted ``values``; None if empty."""
    if not values:
        return None
    return values[max(0, math.ceil(p / 100 * len(values)) - 1)]


@dataclass(frozen=True, slots=True)
class Dist:
    """A distribution's summary: count, total, mean, p50, p95, max (None when empty)."""

    n: int = 0
    total: float = 0
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> Dist:
        """The summary of ``values`` (any order)."""
        data = sorted(values)
        if not data:
            return cls()
        total = sum(data)
        return cls(len(data), total, total / len(data), percentile(data, 50),
                   percentile(data, 95), data[-1])


@dataclass(slots=True)
class StateStats:
    """One state over many instances (see the module docstring for each figure)."""

    state: str
    now: int = 0
    entered: int = 0
    steps: int = 0
    retries: int = 0
    fallbacks: int = 0
    reasks: int = 0
    errors: int = 0
    recoveries: int = 0
    tokens: Dist = field(default_factory=Dist)
    action_ms: Dist = field(default_factory=Dist)
    wall_s: Dist = field(default_factory=Dist)


@dataclass(frozen=True, slots=True)
class EdgeStats:
    """One move taken by instances: rows that took it and distinct instances."""

    source: str
    dest: str
    trigger: str
    kind: str
    taken: int
    instances: int


@dataclass(frozen=True, slots=True)
class ToolStats:
    """One tool of an agent state: calls, error results, call durations (ms)."""

    tool: str
    calls: int
    errors: int
    duration_ms: Dist
    #: The agent state that called it (the first seen, when several do).
    state: str = ""


@dataclass(slots=True)
class MachineStats:
    """Everything ``fsm stats`` reports for one machine."""

    machine: str
    instances: int
    by_status: dict[str, int]
    by_state: dict[str, int]
    by_reason: dict[str, int]
    sources: dict[str, dict[str, int]]
    states: dict[str, StateStats]
    edges: list[EdgeStats]
    tokens: Dist
    wall_s: Dist
    fallback_rate: float | None
    reask_rate: float | None
    tools: dict[str, ToolStats] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``states`` keyed by name, ``edges`` as a list)."""
        return asdict(self)


def _named(counts: dict[str | None, int], none: str = "") -> dict[str, int]:
    """Counts keyed by strings (None becomes ``none``), largest first, then by name."""
    items = ((none if k is None else str(k), v) for k, v in counts.items())
    return dict(sorted(items, key=lambda kv: (-kv[1], kv[0])))


def source_fields(store: Store, where: InstanceFilter) -> list[str]:
    """Context fields named ``*_source`` holding a string, in the newest matching instance."""
    newest = store.query(where, limit=1)
    if not newest:
        return []
    return sorted(k for k, v in newest[0].context.items()
                  if k.endswith("_source") and isinstance(v, str))


class _Accumulator:
    """Folds a machine's history rows (instance by instance, in seq order) into figures."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.edges: dict[tuple[str, str, str, str], list[int]] = {}
        self.instance_tokens: list[float] = []
        self.instance_wall: list[float] = []
        self.with_history = self.with_fallback = self.with_reask = 0
        self._rows: list[StepRow] = []
        #: per tool: [duration_ms of each call], and its error results
        self.tool_ms: dict[str, list[float]] = defaultdict(list)
        self.tool_errors: dict[str, int] = defaultdict(int)
        self.tool_state: dict[str, str] = {}

    def add(self, row: StepRow) -> None:
        """Take the next row; rows of one instance arrive together, in seq order."""
        if self._rows and self._rows[0].instance_id != row.instance_id:
            self.finish()
        self._rows.append(row)

    def finish(self) -> None:
        """Fold the rows of the instance read last."""
        rows, self._rows = self._rows, []
        for row in rows:
            self.counts[row.source]["recoveries"] += row.kind == RECOVERY
        journal = [r for r in rows if r.kind == TOOL]  # an agent's turns and calls
        for row in journal:
            if row.trigger not in _NOT_CALLS:
                self.tool_ms[row.trigger].append(row.duration_ms)
                self.tool_state.setdefault(row.trigger, row.source)
                self.tool_errors[row.trigger] += row.error is not None
        rows = [r for r in rows if r.kind not in NOT_MOVES]  # a takeover, a migration: no step
        if not rows:
            return
        entered = rows[0].created_at
        self.counts[rows[0].source]["entered"] += 1  # where it started
        for row in rows:
            self._step(row, entered)
            entered = row.at
        self.with_history += 1
        self.with_fallback += any(r.kind == "fallback" for r in rows)
        self.with_reask += any(r.reasks > 0 for r in rows)
        self.instance_tokens.append(sum(r.tokens for r in [*rows, *journal]))
        if rows[-1].status in FINAL_STATUSES:
            self.instance_wall.append(max(0.0, rows[-1].at - rows[0].created_at))
        for key in {(r.source, r.dest, r.trigger, r.kind) for r in rows}:
            self.edges[key][1] += 1

    def _step(self, row: StepRow, entered: float) -> None:
        values, counts = self.values[row.source], self.counts[row.source]
        values["tokens"].append(row.tokens)
        values["action_ms"].append(row.duration_ms)
        values["wall_s"].append(max(0.0, row.at - entered))
        counts["steps"] += 1
        counts["retries"] += max(0, row.attempt - 1)
        counts["fallbacks"] += row.kind == "fallback"
        counts["reasks"] += row.reasks
        counts["errors"] += row.error is not None
        self.counts[row.dest]["entered"] += 1
        self.edges.setdefault((row.source, row.dest, row.trigger, row.kind), [0, 0])[0] += 1


def _states(acc: _Accumulator, by_state: dict[str, int]) -> dict[str, StateStats]:
    names = dict.fromkeys([*acc.counts, *by_state])
    out = {}
    for name in names:
        c, s = acc.counts.get(name, {}), acc.values.get(name, {})
        out[name] = StateStats(
            name, now=by_state.get(name, 0), entered=c.get("entered", 0), steps=c.get("steps", 0),
            retries=c.get("retries", 0), fallbacks=c.get("fallbacks", 0),
            reasks=c.get("reasks", 0), errors=c.get("errors", 0),
            recoveries=c.get("recoveries", 0),
            tokens=Dist.of(s.get("tokens", ())), action_ms=Dist.of(s.get("action_ms", ())),
            wall_s=Dist.of(s.get("wall_s", ())))
    return out


def _one_machine(store: Store, where: InstanceFilter, machine: str, total: int) -> MachineStats:
    mine = replace(where, machine=machine)
    by_state = _named(store.count(mine, "state"))
    acc = _Accumulator()
    for row in store.steps(mine):
        acc.add(row)
    acc.finish()
    sources = {f: _named(store.count(mine, f"context.{f}"), "(none)")
               for f in source_fields(store, mine)}
    edges = [EdgeStats(src, dst, trig, kind, n, inst)
             for (src, dst, trig, kind), (n, inst) in acc.edges.items()]
    seen = acc.with_history
    return MachineStats(
        machine=machine, instances=total, by_status=_named(store.count(mine, "status")),
        by_state=by_state,
        by_reason=_named({k: v for k, v in store.count(mine, "reason").items() if k is not None}),
        sources=sources, states=_states(acc, by_state), edges=edges,
        tokens=Dist.of(acc.instance_tokens), wall_s=Dist.of(acc.instance_wall),
        fallback_rate=acc.with_fallback / seen if seen else None,
        reask_rate=acc.with_reask / seen if seen else None,
        tools={t: ToolStats(t, len(ms), acc.tool_errors[t], Dist.of(ms), acc.tool_state[t])
               for t, ms in sorted(acc.tool_ms.items())})


def machine_stats(store: Store, where: InstanceFilter = InstanceFilter()  # noqa: B008 - frozen
                  ) -> dict[str, MachineStats]:
    """Statistics per machine over the instances matching ``where`` (machine name order)."""
    machines = store.count(where, "machine")
    return {m: _one_machine(store, where, m, n)
            for m, n in sorted(machines.items(), key=lambda kv: str(kv[0])) if m is not None}


__all__ = ["Dist", "StateStats", "ToolStats", "EdgeStats", "MachineStats", "machine_stats", "percentile",
           "source_fields"]
