"""Schedules in the store (format 15): shared SQL of every backend.

One row per schedule (``ScheduleRow``), keyed by its name: what to start (a machine's
module and name, an input), when (a cron expression or an interval, in a time zone),
what a tick does while the last one runs (``overlap``) and after downtime
(``catchup``), and where it stands: ``next_fire`` (epoch seconds of the next tick due),
the last tick fired and its instance.  Every change is a compare-and-set on ``version``
(``Store.update_schedule``), so workers on many hosts firing the same tick agree on who
advanced it; the tick's instance itself is deduplicated by its id
(``runtime.schedules``).  Rows are data like any other stored value: the runtime checks
a row's module against the process's trust before importing it.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import stored_json

#: The table and its index (``{real}``: the backend's floating-point type).
TABLE = ("CREATE TABLE schedules (name TEXT PRIMARY KEY, module TEXT NOT NULL, "
         "machine TEXT NOT NULL, cron TEXT, every_s {real}, tz TEXT NOT NULL, "
         "input TEXT NOT NULL, overlap TEXT NOT NULL, catchup TEXT NOT NULL, "
         "paused INTEGER NOT NULL, anchor {real} NOT NULL, next_fire {real} NOT NULL, "
         "last_fire {real}, last_instance TEXT, skipped INTEGER NOT NULL, "
         "missed INTEGER NOT NULL, created_at {real}, version INTEGER NOT NULL)")
INDEX = "CREATE INDEX idx_schedules_due ON schedules (paused, next_fire)"

COLUMNS = ("name", "module", "machine", "cron", "every_s", "tz", "input", "overlap", "catchup",
           "paused", "anchor", "next_fire", "last_fire", "last_instance", "skipped", "missed",
           "created_at", "version")
_COLS = ", ".join(COLUMNS)
#: Statements (``?`` placeholders) both backends run.
ADD = (f"INSERT INTO schedules ({_COLS}) VALUES ({', '.join('?' * len(COLUMNS))}) "
       "ON CONFLICT (name) DO NOTHING")
GET = f"SELECT {_COLS} FROM schedules WHERE name = ?"
ALL = f"SELECT {_COLS} FROM schedules ORDER BY name"
DUE = (f"SELECT {_COLS} FROM schedules WHERE paused = 0 AND next_fire <= ? "
       "ORDER BY next_fire, name LIMIT ?")
NEXT = "SELECT MIN(next_fire) FROM schedules WHERE paused = 0"
UPDATE = ("UPDATE schedules SET " + ", ".join(f"{c} = ?" for c in COLUMNS[1:-1])
          + ", version = version + 1 WHERE name = ? AND version = ?")
DELETE = "DELETE FROM schedules WHERE name = ?"


@dataclass(slots=True)
class ScheduleRow:
    """One stored schedule.

    ``cron`` (5 fields, or 6 with seconds first) or ``every_s`` (seconds > 0) says when it
    ticks, in the IANA zone ``tz``; interval ticks fall at ``anchor + n * every_s``.
    ``input`` is the JSON object each tick's instance starts with.  ``overlap``: ``skip``,
    ``queue`` or ``allow``; ``catchup``: ``none``, ``latest`` or ``all``.  ``next_fire``,
    ``last_fire``, ``anchor`` and ``created_at`` are epoch seconds; ``skipped`` counts the
    ticks an overlap skipped, ``missed`` those downtime dropped (``catchup``); ``version``
    grows with every write (compare-and-set).
    """

    name: str
    module: str
    machine: str
    cron: str | None
    every_s: float | None
    tz: str
    input: dict[str, Any]
    overlap: str
    catchup: str
    paused: bool
    anchor: float
    next_fire: float
    last_fire: float | None = None
    last_instance: str | None = None
    skipped: int = 0
    missed: int = 0
    created_at: float = 0.0
    version: int = 1


def encode(row: ScheduleRow) -> list[Any]:
    """The row's values in ``COLUMNS`` order (the input as strict JSON)."""
    return [row.name, row.module, row.machine, row.cron, row.every_s, row.tz,
            json.dumps(row.input, sort_keys=True, allow_nan=False), row.overlap, row.catchup,
            int(row.paused), row.anchor, row.next_fire, row.last_fire, row.last_instance,
            row.skipped, row.missed, row.created_at, row.version]


def update_args(row: ScheduleRow, expected_version: int) -> list[Any]:
    """``UPDATE``'s arguments: every column but name and version, then the key."""
    values = encode(row)
    return values[1:-1] + [row.name, expected_version]


def decode(values: Sequence[Any]) -> ScheduleRow:
    """A stored row; ``StoreError`` when its input is not a JSON object."""
    v = list(values)
    data = stored_json.read(stored_json.OBJECT, v[6], f"the stored input of schedule {v[0]!r} is")
    return ScheduleRow(
        name=str(v[0]), module=str(v[1]), machine=str(v[2]), cron=v[3],
        every_s=None if v[4] is None else float(v[4]), tz=str(v[5]), input=data,
        overlap=str(v[7]), catchup=str(v[8]), paused=bool(v[9]), anchor=float(v[10]),
        next_fire=float(v[11]), last_fire=None if v[12] is None else float(v[12]),
        last_instance=v[13], skipped=int(v[14]), missed=int(v[15]),
        created_at=float(v[16] or 0), version=int(v[17]))


class ScheduleStore(Protocol):
    """Stored schedules (``store.schedules``, format 15): what ``fsm worker`` fires.
    Every change is a compare-and-set on the row's ``version``."""

    def add_schedule(self, row: ScheduleRow) -> bool:
        """Insert ``row`` unless its name exists: True when this call inserted it.

        Status: none changes."""

    def get_schedule(self, name: str) -> ScheduleRow | None:
        """The schedule named ``name`` (``None``: none).  Status: none changes."""

    def schedules(self) -> builtins.list[ScheduleRow]:
        """Every schedule, by name.  Status: none changes."""

    def due_schedules(self, now: float, limit: int) -> builtins.list[ScheduleRow]:
        """At most ``limit`` unpaused schedules whose ``next_fire`` is at or before
        ``now`` (epoch seconds), earliest first (one indexed query).  Status: none changes."""

    def next_schedule_fire(self) -> float | None:
        """The earliest ``next_fire`` of the unpaused schedules (``None``: none).

        Status: none changes."""

    def update_schedule(self, row: ScheduleRow, expected_version: int) -> bool:
        """Write ``row`` (by name) when the stored version is ``expected_version``, the
        version then growing by one (set on ``row``); False, nothing written, when another
        writer changed it first or it is gone.  Status: none changes."""

    def update_schedules(self, changes: Sequence[tuple[ScheduleRow, int]]
                         ) -> builtins.list[bool]:
        """``update_schedule`` of each ``(row, expected_version)``, in one transaction, in
        the order given (callers sort by name: concurrent batches lock rows in one order);
        per change, True when it applied.  Status: none changes."""

    def delete_schedule(self, name: str) -> bool:
        """Remove the schedule (its instances stay); False when there was none.

        Status: none changes."""
