"""The one invariant checker of the intersection matrix, run on every cell.

``check(store, executions, deliveries, ...)`` returns the violations found (an empty
list: the cell holds), each one line naming the instance:

1. every committed step ran once: each recorded step of a state whose action logs its
   runs (``tests/integration/matrix_machines.py``) is matched by runs started before its commit
   (row ``at``) — one, or one more per takeover (``recovery`` row) or lost commit the cell
   allows between it and the step before — and no run starts after the last commit of
   its (instance, state, visit);
2. side effects: one outbox row per key, ``done``; no key reached the receiver more often
   than its outbox row was attempted; no item of work delivered under more keys than
   ``keys_per_item`` allows (a rerun in place delivers again, under a new key);
3. no duplicate children for one item: one child per (parent, branch);
4. a parent whose children are all final has joined (one ``join`` row, not waiting);
5. the audit history replays to the stored row: ``seq`` 1..n, the state the last row's
   destination, the context the input plus the deltas, the definition choosing every
   recorded transition again (``fsm_engine.runtime.kinds.replay``), and ``Store.check()``
   (what ``fsm check`` reports) clean;
6. agent states (``matrix_agent``): each turn and tool call journaled once, each journaled
   call run at most once more per takeover and never after its row, a completed loop's
   answer and journal those of an uninterrupted run;
7. streamed steps (``matrix_stream``), through the public reader: gapless offsets, exact
   resumes, no attempt that looks complete and is not, every attempt a crash left open
   superseded, the committed step's reply the last attempt's text.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import matrix_agent
import matrix_stream

from fsm_engine.runtime.kinds.replay import replay
from fsm_engine.store import FINAL_STATUSES
from fsm_engine.views import context_after

#: History kinds that record a step whose action ran (a forced move runs none).
_STEPS = frozenset({"transition", "fallback", "skip"})
#: States of tests/integration/matrix_machines.py whose actions log each run.
LOGGED = frozenset({"work", "notify", "start", "finish"})


def check(store: Any, executions: Sequence[dict[str, Any]],
          deliveries: Sequence[dict[str, Any]], *, definition: Callable[[Any], Any],
          keys_per_item: int = 1, lost_commits: int = 0) -> list[str]:
    """Every violation of the five invariants in ``store`` (see the module docstring).

    ``executions``: the runs the actions logged (``iid``, ``state``, ``at``);
    ``deliveries``: what the receiver got (``key``, ``item``); ``definition(rec)`` -> the
    compiled machine to replay ``rec`` with; ``lost_commits``: runs per step the cell may
    repeat without a takeover row (a commit lost to a database restart).
    """
    records = store.list()
    by_id = {r.id: r for r in records}
    histories = {r.id: store.history(r.id) for r in records}
    problems = [*_ran_once(records, histories, executions, lost_commits),
                *_deliveries(store.outbox(), deliveries, keys_per_item),
                *_families(records, histories),
                *_replays(records, histories, definition),
                *matrix_agent.check(records, histories, executions, lost_commits),
                *matrix_stream.check(store, records, histories)]
    problems += [f"store check: {p}" for p in store.check()]
    problems += [f"{r.id}: left {r.status} ({r.reason})" for r in records
                 if r.status not in FINAL_STATUSES and by_id[r.id].parent_id is None]
    return problems


def _ran_once(records: Sequence[Any], histories: dict[str, list[Any]],
              executions: Sequence[dict[str, Any]], lost: int) -> list[str]:
    runs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in executions:
        runs[(e["iid"], e["state"])].append(e["at"])
    problems: list[str] = []
    for rec in records:
        rows = histories[rec.id]
        copied = rec.forked_at_seq or 0
        for state in LOGGED:
            problems += _state_runs(rec.id, state, rows, copied, sorted(runs[(rec.id, state)]),
                                    lost)
    return problems


def _state_runs(iid: str, state: str, rows: list[Any], copied: int, runs: list[float],
                lost: int) -> list[str]:
    """Match ``iid``'s runs of ``state`` to its committed steps of that state, in time."""
    problems, since, takeovers = [], 0.0, 0
    for row in rows:
        if row.kind == "recovery":
            takeovers += 1
        if row.source != state or row.kind not in _STEPS or row.seq <= copied \
                or row.detail.get("delivered_by_original"):
            continue
        mine = [t for t in runs if since < t <= row.at]
        if not mine:
            problems.append(f"{iid}: step seq {row.seq} ({state}) committed without a run")
        elif len(mine) > 1 + takeovers + lost:
            problems.append(f"{iid}: step seq {row.seq} ({state}) ran {len(mine)} times with "
                            f"{takeovers} takeover(s) before its commit")
        since, takeovers = row.at, 0
    late = [t for t in runs if t > since]
    if late and rows and rows[-1].dest != state:
        problems.append(f"{iid}: {state} ran {len(late)} time(s) after its last commit "
                        f"(seq {max((r.seq for r in rows if r.source == state), default=0)})")
    return problems


def _deliveries(outbox: Sequence[Any], deliveries: Sequence[dict[str, Any]],
                keys_per_item: int) -> list[str]:
    problems: list[str] = []
    rows = Counter(b.key for b in outbox)
    problems += [f"outbox key {k} has {n} rows" for k, n in rows.items() if n > 1]
    problems += [f"outbox key {b.key} is {b.status}" for b in outbox if b.status != "done"]
    attempts = {b.key: b.attempts for b in outbox}
    got = Counter(d["key"] for d in deliveries)
    for key, n in got.items():
        if n > attempts.get(key, 0):
            problems.append(f"key {key} delivered {n} times, outbox attempts "
                            f"{attempts.get(key, 0)}")
    keys: dict[str, set[str]] = defaultdict(set)
    for d in deliveries:
        keys[d["item"]].add(d["key"])
    problems += [f"item {item!r} delivered under {len(ks)} keys: {sorted(ks)}"
                 for item, ks in keys.items() if len(ks) > keys_per_item]
    return problems


def _families(records: Sequence[Any], histories: dict[str, list[Any]]) -> list[str]:
    kids: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        if rec.parent_id:
            kids[rec.parent_id].append(rec)
    problems: list[str] = []
    for parent_id, children in kids.items():
        branches = Counter(c.branch for c in children)
        problems += [f"{parent_id}: {n} children for item/branch {b!r}: "
                     f"{sorted(c.id for c in children if c.branch == b)}"
                     for b, n in branches.items() if n > 1]
        if all(c.status in FINAL_STATUSES for c in children):
            parent = next(r for r in records if r.id == parent_id)
            joins = sum(h.kind == "join" for h in histories[parent_id])
            if joins != 1 or (parent.status, parent.reason) == ("waiting", "children"):
                problems.append(f"{parent_id}: children all final, {joins} join row(s), "
                                f"parent {parent.status}/{parent.reason}")
    return problems


def _replays(records: Sequence[Any], histories: dict[str, list[Any]],
             definition: Callable[[Any], Any]) -> list[str]:
    problems: list[str] = []
    for rec in records:
        rows = histories[rec.id]
        if [r.seq for r in rows] != list(range(1, len(rows) + 1)) or rec.seq != len(rows):
            problems.append(f"{rec.id}: history seq {[r.seq for r in rows]}, row seq {rec.seq}")
        if rows and rec.state != rows[-1].dest:
            problems.append(f"{rec.id}: in {rec.state}, last row ends in {rows[-1].dest}")
        if rows and context_after(rec, rows)[-1] != rec.context:
            problems.append(f"{rec.id}: the deltas replay to {context_after(rec, rows)[-1]}, "
                            f"the row holds {rec.context}")
        found = replay(definition(rec), rec, rows)
        if found.divergence or found.guards or found.missing_states:
            problems.append(f"{rec.id}: replay differs: {found.divergence or found.guards}")
    return problems
