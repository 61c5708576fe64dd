"""Firing due schedule ticks in batches (``Schedules.fire_due``; see ``runtime.schedules``).

One call plans every due schedule it read (``plan``: which ticks start, which are dropped
or skipped, where the row goes next: a pure function of the row, the time and whether its
last instance still runs), then writes in three steps, each one transaction for the whole
batch, however many schedules are due:

1. **claim** every row that starts a tick (a compare-and-set of its version, nothing else
   changed) and write the rows that start nothing (dropped or skipped ticks);
2. **start** the claimed ticks' instances under their ids (``schedule_spec.tick_id``) and
   idempotency keys (``schedule_spec.tick_key``, unique per machine: ``Engine.start``'s
   ``key``), one ``start_many`` per machine (all or none); when one is there already
   (another worker, or this tick again after a crash) each starts alone, and a tick whose
   instance is there is not started twice;
3. **advance** each claimed row from its claimed version.

A worker that dies between 1 and 3 leaves its rows claimed but due: the next call, on any
worker, plans the same ticks again (the plan depends on the row, which did not move) and
finds their instances.  Rows are written in name order, so concurrent batches lock them in
one order (PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from ..errors import (
    DefinitionError,
    FsmError,
    InstanceNotFound,
    InvalidInput,
    StartConflict,
    StoreError,
)
from ..store.schedules import ScheduleRow
from . import schedule_spec as spec
from . import start_options

if TYPE_CHECKING:
    from .compiled import CompiledMachine
    from .engine import Engine

#: Most missed ticks ``catchup="all"`` starts after downtime (the newest of them).
CATCHUP_MAX = 100
#: How late (seconds) the newest due tick may be for ``catchup="none"`` still to start it.
ON_TIME_S = 60.0


class Previous(NamedTuple):
    """The schedule's last instance: still running (not final), and when it ended."""

    running: bool
    ended_at: float | None


@dataclass(slots=True)
class Plan:
    """What one due schedule does now: ``start`` these ticks (oldest first), then the row
    becomes ``after``; ``row`` is the row as read."""

    row: ScheduleRow
    start: list[float]
    after: ScheduleRow


def plan(row: ScheduleRow, now: float, prev: Previous) -> Plan | None:
    """The plan for ``row`` at ``now`` (``None``: nothing to write — ``queue`` waits for its
    last instance).  See the catch-up and overlap rules in ``runtime.schedules``."""
    if row.overlap == "queue" and prev.running:
        return None
    due = spec.ticks(row, row.next_fire, now, CATCHUP_MAX)
    fire = _chosen(row, due, now, prev)
    dropped = (spec.count_older(row, row.next_fire, due[0]) if due else 0) + len(due) - len(fire)
    start, skipped, nxt = fire, 0, spec.next_after(row, now)
    if row.overlap == "skip" and fire:  # one starts (unless the last one runs), the rest skip
        start = [] if prev.running else fire[:1]
        skipped = len(fire) - len(start)
    elif row.overlap == "queue" and len(fire) > 1:  # the rest wait behind the one started
        start, nxt = fire[:1], fire[1]
    after = replace(row, next_fire=nxt, missed=row.missed + dropped,
                    skipped=row.skipped + skipped)
    if start:
        after.last_fire, after.last_instance = start[-1], spec.tick_id(row.name, start[-1])
    return Plan(row, start, after)


def _chosen(row: ScheduleRow, due: list[float], now: float, prev: Previous) -> list[float]:
    """The due ticks to start, by ``row.catchup``."""
    if not due or row.catchup == "all":
        return due
    if row.catchup == "latest":
        return due[-1:]
    waited = prev.ended_at if row.overlap == "queue" and prev.ended_at else 0.0
    return due[-1:] if now - max(due[-1], waited) <= ON_TIME_S else []


def previous(engine: Engine, row: ScheduleRow) -> Previous:
    """Whether ``row``'s last instance still runs (one read; none for ``overlap=allow``)."""
    if row.last_instance is None or row.overlap == "allow":
        return Previous(False, None)
    try:
        rec = engine.store.get(row.last_instance)
    except InstanceNotFound:  # deleted (pruned): nothing runs
        return Previous(False, None)
    return Previous(not rec.final, rec.updated_at if rec.final else None)


def write(engine: Engine, plans: Sequence[Plan],
          machine: Callable[[ScheduleRow], CompiledMachine]
          ) -> tuple[list[Plan], dict[str, tuple[int, FsmError]]]:
    """Claim, start and advance ``plans`` (steps 1-3 above): ``(the plans that started
    their ticks and advanced, the rows refused here by name: (their version now, why))``.
    ``machine(row)``: the row's compiled machine, or what refuses it (``MachineRefused``,
    ``DefinitionError``); a row whose machine or input is refused is left claimed and due,
    for another worker.  Raises ``StoreError``."""
    store = engine.store
    plans = sorted(plans, key=lambda p: p.row.name)
    changes = [(replace(p.row) if p.start else p.after, p.row.version) for p in plans]
    done = store.update_schedules(changes)
    claimed = {p.row.name: (p, row.version)
               for p, (row, _), ok in zip(plans, changes, done, strict=True) if ok and p.start}
    refused: dict[str, tuple[int, FsmError]] = {}
    by_machine: dict[str, list[Plan]] = {}
    for p, _ in claimed.values():
        by_machine.setdefault(p.row.machine, []).append(p)
    for group in by_machine.values():
        for name, exc in _start(engine, group, machine).items():
            refused[name] = (claimed.pop(name)[1], exc)
    moved = store.update_schedules([(p.after, v) for p, v in claimed.values()])
    return [p for (p, _), ok in zip(claimed.values(), moved, strict=True) if ok], refused


def _start(engine: Engine, group: list[Plan],
           machine: Callable[[ScheduleRow], CompiledMachine]) -> dict[str, FsmError]:
    """Start the ticks' instances of one machine's plans; the rows refused, by name."""
    try:
        cm = machine(group[0].row)
    except (DefinitionError, InvalidInput) as exc:
        return {p.row.name: exc for p in group}
    ticks = [(p.row, t) for p in group for t in p.start]
    try:  # one transaction for them all (a tick started before fails it: each alone, below)
        engine.start_many(cm.spec, [row.input for row, _ in ticks], enqueue=True,
                          ids=[spec.tick_id(row.name, t) for row, t in ticks],
                          keys=[spec.tick_key(row.name, t) for row, t in ticks])
        return {}
    except (StoreError, InvalidInput):
        pass
    refused: dict[str, FsmError] = {}
    for p in group:
        for t in p.start:
            try:
                start_tick(engine, cm, p.row, t)
            except InvalidInput as exc:
                refused[p.row.name] = exc
                break
    return refused


def start_tick(engine: Engine, cm: CompiledMachine, row: ScheduleRow,
               tick: float) -> tuple[str, bool]:
    """Start one tick's instance (unowned, for any worker) under its id and its idempotency
    key (``schedule_spec.tick_key``, through ``Engine.start_many``'s ``key``): ``(its id,
    started now)``; the instance already there for the tick is returned, not started again.
    Raises ``StoreError`` (the store failed: the tick stays due), ``InvalidInput`` (the
    input no longer fits the machine)."""
    iid = spec.tick_id(row.name, tick)
    if exists(engine, iid):
        return iid, False
    key = start_options.check(engine.clock(), key=spec.tick_key(row.name, tick))
    try:
        got = engine.start_many(cm.spec, [row.input], ids=[iid], enqueue=True, options=key)[0]
    except StartConflict as exc:  # the key's instance, started with another input
        return exc.instance_id or iid, False
    except StoreError:
        if not exists(engine, iid):  # (a racer took the id: the tick's instance)
            raise
        return iid, False
    return got, got == iid


def exists(engine: Engine, instance_id: str) -> bool:
    """Whether ``engine``'s store holds an instance with id ``instance_id`` (a tick's
    instance: ``schedule_spec.tick_id``)."""
    try:
        engine.store.get(instance_id)
    except InstanceNotFound:
        return False
    return True
