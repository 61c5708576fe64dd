"""Schedules managed at runtime and stored (issue 38, item 2): ``Engine.schedules``.

A schedule (``store.schedules.ScheduleRow``) starts one instance of a machine per tick
(``runtime.schedule_spec``: cron or an interval, in a time zone).  Every ``fsm worker``
calls ``fire_due`` in its poll loop, and **each tick makes exactly one instance across the
fleet**, also when workers race for it, one is SIGKILLed mid-tick or the database
restarts:

1. *claim*: a compare-and-set on the schedule row's ``version`` (nothing else changes), so
   a worker holding a stale read of the row (another advanced it meanwhile) stops here;
2. *start*: the tick's instance is created with the idempotency key naming the schedule
   and the tick (``Engine.start(..., key=...)``, ``schedule_spec.tick_key``:
   ``schedule:nightly:2026-12-07T06:00:00.000Z``) under an id naming them too
   (``schedule_spec.tick_id``: ``nightly-20261207T060000Z``).  A second start of that tick
   (a racing worker, or one taking over after a worker died between 2 and 3) finds the
   instance there and starts nothing;
3. *advance*: a compare-and-set of ``next_fire`` (and ``last_fire``, ``last_instance``).
   A worker that dies after 2 leaves the row due; the next worker repeats 1-3 for the
   same tick, and 2 finds the instance.

Each step is one transaction for all the schedules due at once (``runtime.schedule_fire``),
so a thousand ticks falling in the same second cost three transactions per ``DUE_BATCH``,
not three per tick.

What a due tick does:

- ``overlap`` (while the schedule's last instance is not final): ``skip`` advances past
  the tick, counting it in ``skipped``; ``queue`` leaves it due, started once the last
  instance ends (ticks that came meanwhile follow ``catchup``: with ``none``, the newest of
  them starts); ``allow`` starts it anyway.
- ``catchup`` (ticks missed during downtime, found when ``fire_due`` runs later than
  the next tick): ``none`` starts the newest due tick only while it is at most
  ``ON_TIME_S`` late (the ticks skipped count in ``missed``); ``latest`` starts the
  newest due tick however late; ``all`` starts every due tick in order, at most
  ``CATCHUP_MAX`` of them (the newest; older ones count in ``missed``).

A paused schedule fires nothing; ``resume`` sets its next tick after now (paused ticks
are not caught up).  ``backfill`` starts the ticks of a past range (at most
``BACKFILL_MAX``), each under the same id a live tick would have had, so a tick that
already has its instance is not started twice; it leaves the row as it is.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..definition import Machine
from ..errors import DefinitionError, InvalidInput
from ..store.schedules import ScheduleRow
from . import schedule_fire as fire
from . import schedule_spec as spec
from .client import validate_input

if TYPE_CHECKING:
    from .compiled import CompiledMachine
    from .engine import Engine

log = logging.getLogger("fsm_engine")

#: Most missed ticks ``catchup="all"`` starts after downtime (the newest of them), and how
#: late (seconds) the newest due tick may be for ``catchup="none"`` still to start it.
CATCHUP_MAX, ON_TIME_S = fire.CATCHUP_MAX, fire.ON_TIME_S
#: Most ticks one ``backfill`` starts.
BACKFILL_MAX = 1000
#: Most due schedules one batch of ``fire_due`` reads (then the next batch, at once).
DUE_BATCH = 100


@dataclass(frozen=True, slots=True)
class Fired:
    """A tick's instance: ``new`` False when it had been started before (deduplicated)."""

    schedule: str
    tick: float
    instance_id: str
    new: bool


class Schedules:
    """The stored schedules of ``engine``'s store, and the firing of their ticks.

    Errors: ``InvalidInput`` (one line, nothing written) for a bad name, cron expression,
    interval, zone, choice or input, an unknown or duplicate name; ``DefinitionError``
    (``MachineLoadError``) when the module is no machine; ``StoreError`` when the
    database is unusable.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: Schedules this process may not fire (untrusted module, input the code refuses)
        #: by name -> the row version refused: left to other workers, told once.
        self.refused: dict[str, int] = {}

    # -- managing -------------------------------------------------------------------------
    def add(self, name: str, machine: Machine | str, *, cron: str | None = None,
            every: str | float | timedelta | None = None, tz: str = "UTC",
            input: BaseModel | Mapping[str, Any] | None = None, overlap: str = "skip",
            catchup: str = "none", paused: bool = False) -> ScheduleRow:
        """Store a schedule named ``name`` starting ``machine`` (a ``Machine`` or a module
        reference) with ``input`` on every tick of ``cron`` (5 fields, or 6 with seconds
        first) or ``every`` (seconds, a ``timedelta`` or text such as ``2s``/``1h30m``),
        read in time zone ``tz``; see the module docstring for ``overlap``/``catchup``.
        The first tick is the next one after now.  Returns the stored row."""
        expr, every_s = checked(name, cron=cron, every=every, tz=tz, overlap=overlap,
                                catchup=catchup)
        if self.engine.store.get_schedule(name) is not None:
            raise InvalidInput(f"schedule {name!r} exists (fsm schedule delete {name} first)")
        cm = self.engine.load(machine) if isinstance(machine, str) else \
            self.engine.register(machine)
        data = _plain(input)
        validate_input(cm.spec.context, data)
        now = self.engine.clock()
        anchor = float(int(now) + 1) if every_s is not None else now
        row = ScheduleRow(name=name, module=self.engine.registry.modules[cm.name],
                          machine=cm.name, cron=expr, every_s=every_s, tz=tz, input=data,
                          overlap=overlap, catchup=catchup, paused=paused, anchor=anchor,
                          next_fire=0.0, created_at=now)
        row.next_fire = spec.next_after(row, anchor if every_s is not None else now)
        if not self.engine.store.add_schedule(row):
            raise InvalidInput(f"schedule {name!r} exists (fsm schedule delete {name} first)")
        return row

    def get(self, name: str) -> ScheduleRow:
        """The schedule named ``name``; ``InvalidInput`` when there is none."""
        row = self.engine.store.get_schedule(name)
        if row is None:
            raise InvalidInput(f"no schedule named {str(name)[:100]!r} "
                               "(see `fsm schedule list`)")
        return row

    def list(self) -> builtins.list[ScheduleRow]:
        """Every schedule, by name."""
        return self.engine.store.schedules()

    def pause(self, name: str) -> ScheduleRow:
        """Stop firing ``name`` until ``resume`` (a paused one stays paused)."""
        return self._change(name, lambda row: replace(row, paused=True))

    def resume(self, name: str) -> ScheduleRow:
        """Fire ``name`` again from its next tick after now (no tick of the pause is
        caught up); an unpaused one is left as it is."""
        def resumed(row: ScheduleRow) -> ScheduleRow:
            if not row.paused:
                return row
            return replace(row, paused=False,
                           next_fire=spec.next_after(row, self.engine.clock()))
        return self._change(name, resumed)

    def delete(self, name: str) -> None:
        """Remove ``name`` (the instances it started stay)."""
        if not self.engine.store.delete_schedule(self.get(name).name):
            raise InvalidInput(f"no schedule named {name!r} (deleted meanwhile)")

    def _change(self, name: str, change: Any) -> ScheduleRow:
        while True:  # compare-and-set: a worker advancing it meanwhile makes us read again
            row = self.get(name)
            new = change(row)
            if new is row or self.engine.store.update_schedule(new, row.version):
                return new

    def backfill(self, name: str, start: float, end: float) -> builtins.list[Fired]:
        """Start one instance per tick of ``name`` in ``[start, end]`` (epoch seconds, not
        past now), oldest first; a tick whose instance exists is not started again.  At most
        ``BACKFILL_MAX`` ticks, else ``InvalidInput`` and nothing started."""
        row = self.get(name)
        if end < start:
            raise InvalidInput("--to is before --from")
        if end > self.engine.clock():
            raise InvalidInput("--to is in the future (backfill fills the past; the "
                               "schedule fires what comes)")
        found = spec.ticks(row, start, end, BACKFILL_MAX + 1)
        if len(found) > BACKFILL_MAX:
            raise InvalidInput(f"the range holds more than {BACKFILL_MAX} ticks of {name!r}: "
                               "backfill a shorter one")
        cm = self._machine(row)
        return [Fired(row.name, t, *fire.start_tick(self.engine, cm, row, t)) for t in found]

    # -- firing (``fsm worker``'s poll loop) --------------------------------------------------
    def fire_due(self) -> float | None:
        """Fire every due tick of the store's unpaused schedules, ``DUE_BATCH`` schedules at
        a time (``runtime.schedule_fire``); return the
        earliest next tick (epoch seconds; ``None``: no schedule; a time already past: a
        schedule left due, queued behind its last instance or refused here).  Raises
        ``StoreError`` when the database is unusable (a tick half done is finished by the
        next call, on any worker)."""
        while self._batch(self.engine.clock()):
            pass  # a full batch that moved on: more may be due behind it
        return self.engine.store.next_schedule_fire()

    def _batch(self, now: float) -> bool:
        """Fire one batch; True when it was full and wrote something."""
        limit = DUE_BATCH + len(self.refused)
        rows = self.engine.store.due_schedules(now, limit)
        plans = []
        for row in rows:
            if self.refused.get(row.name) == row.version:
                continue
            try:
                found = fire.plan(row, now, fire.previous(self.engine, row))
            except (InvalidInput, ValueError, KeyError, TypeError) as exc:  # a stored cron or zone
                # gone bad (a store that fails raises StoreError: the batch stops)
                self._refuse(row.name, row.version, InvalidInput(f"unreadable: {exc}"))
                continue
            if found is not None:
                plans.append(found)
        if not plans:
            return False
        _, refused = fire.write(self.engine, plans, self._machine)
        for name, (version, why) in refused.items():
            self._refuse(name, version, why)
        return len(rows) == limit and len(refused) < len(plans)

    def _refuse(self, name: str, version: int, exc: Exception) -> None:
        self.refused[name] = version
        log.warning("schedule %s left to other workers: %s", name, exc)

    def _machine(self, row: ScheduleRow) -> CompiledMachine:
        """The schedule's machine: registered here, or its module if this process trusts it
        (``MachineRefused`` else: a stored row names it)."""
        registry = self.engine.registry
        cm = registry.machines.get(row.machine)
        if cm is None:
            self.engine.trust.check(row.module, f"(schedule {row.name})")
            cm = registry.load(row.module, named=False)
            if cm.name != row.machine:
                raise DefinitionError(row.machine, [f"module {row.module} defines "
                                                    f"{cm.name!r}, not {row.machine!r}"])
        return cm


def started_by(store: Any, instance_id: str) -> tuple[ScheduleRow, float] | None:
    """The schedule and tick whose instance ``instance_id`` is (its id names them, and the
    schedule has that tick); ``None`` for any other instance (or a deleted schedule's)."""
    found = spec.parse_tick_id(instance_id)
    row = None if found is None else store.get_schedule(found[0])
    if found is None or row is None or spec.ticks(row, found[1], found[1], 1) != [found[1]]:
        return None
    return row, found[1]


def checked(name: str, *, cron: str | None, every: str | float | timedelta | None, tz: str,
            overlap: str, catchup: str) -> tuple[str | None, float | None]:
    """Check a schedule's parts without touching a store: ``(the cron expression
    normalised, the interval in seconds)``, one of them ``None``; ``InvalidInput`` (one
    line) for the first part at fault."""
    spec.check_name(name)
    spec.check_choice(overlap, spec.OVERLAPS, "overlap")
    spec.check_choice(catchup, spec.CATCHUPS, "catchup")
    if (cron is None) == (every is None):
        raise InvalidInput("a schedule takes exactly one of --cron EXPR or --every DURATION")
    every_s = None if every is None else spec.parse_every(
        every.total_seconds() if isinstance(every, timedelta) else every)
    expr = None if cron is None else spec.check_cron(cron)
    spec.zone(tz)
    return expr, every_s


def _plain(data: BaseModel | Mapping[str, Any] | None) -> dict[str, Any]:
    """A schedule's input as a JSON object (``InvalidInput`` when it is not one)."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InvalidInput("a schedule's input is a JSON object")
    try:
        out = json.loads(json.dumps(dict(data), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"a schedule's input is not JSON: {exc}") from None
    return out
