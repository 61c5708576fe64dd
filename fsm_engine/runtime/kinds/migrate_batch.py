"""``fsm migrate``: upcast every stored instance of older machine versions at once.

``survey`` reads the unfinished instances (of one machine, or all), loads each
one's machine and sorts them: to migrate (with the version change and the
context diff), cannot be migrated (``needs_migration`` and its cause), refused
(a newer version, or a fingerprint change without a version bump), held by a
live worker (it upcasts them at their next step), or current.  ``apply``
writes the migrations in batches, one transaction per batch; each instance is
a compare-and-set on its version, so one that moved meanwhile is skipped, and
a process killed at any instant leaves each instance wholly migrated or not.
An instance that cannot be migrated keeps its row; ``apply`` only records
reason ``needs_migration`` and the cause on it (``fsm list --reason``).
Finished instances are never touched (a fork of one is upcast when it runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import FsmError, MachineRefused, NeedsMigration, VersionTooNew
from ...store.records import (
    PENDING,
    RUNNING,
    WAITING,
    InstanceFilter,
    InstanceRecord,
    StepCommit,
)
from .. import outcome
from ..fleet.liveness import live_ids
from . import migration

if TYPE_CHECKING:
    from ..engine import Engine

#: What ``survey`` says of one instance.
MIGRATE, NEEDS, REFUSED, HELD, CURRENT = "migrate", "needs_migration", "refused", "held", "current"


@dataclass(slots=True)
class Entry:
    """One unfinished instance: ``outcome`` (one of the constants above), the version change
    and, to migrate, ``diff`` (``Upcast.diff``); ``cause`` when it cannot or may not be."""

    id: str
    machine: str
    state: str
    status: str
    from_version: int
    to_version: int | None
    outcome: str
    cause: str | None = None
    diff: dict[str, Any] | None = None
    applied: bool = False
    upcast: migration.Upcast | None = field(default=None, repr=False)
    record: InstanceRecord | None = field(default=None, repr=False)

    def as_json(self) -> dict[str, Any]:
        """The entry as a JSON object (``upcast`` and ``record`` left out)."""
        return {"id": self.id, "machine": self.machine, "state": self.state,
                "status": self.status, "from_version": self.from_version,
                "to_version": self.to_version, "outcome": self.outcome, "cause": self.cause,
                "diff": self.diff, "applied": self.applied}


def _entry(engine: Engine, rec: InstanceRecord, live: set[str]) -> Entry:
    base: dict[str, Any] = dict(id=rec.id, machine=rec.machine, state=rec.state, status=rec.status,
                from_version=rec.machine_version, record=rec)
    try:
        cm = engine.definition(rec)
    except MachineRefused:
        raise  # a module it may not import: the whole survey is refused, nothing imported
    except FsmError as exc:
        return Entry(**base, to_version=None, outcome=REFUSED, cause=str(exc))
    to = cm.spec.version
    try:
        up = migration.plan(cm, rec, engine.clock())
    except NeedsMigration as exc:
        return Entry(**base, to_version=to, outcome=NEEDS, cause=exc.cause)
    except FsmError as exc:  # VersionTooNew, FingerprintMismatch
        kind = "newer version" if isinstance(exc, VersionTooNew) else "fingerprint"
        return Entry(**base, to_version=to, outcome=REFUSED, cause=f"{kind}: {exc}")
    if up is None:
        return Entry(**base, to_version=to, outcome=CURRENT)
    if rec.owner is not None and rec.owner in live:
        return Entry(**base, to_version=to, outcome=HELD, diff=up.diff,
                     cause=f"held by live worker {rec.owner}: upcast at its next step")
    return Entry(**base, to_version=to, outcome=MIGRATE, diff=up.diff, upcast=up)


def survey(engine: Engine, machine: str | None = None) -> list[Entry]:
    """Every unfinished instance (of ``machine``, or all), oldest first, sorted into what
    ``apply`` would do with it; nothing is written.  ``MachineRefused`` when one names a
    module the engine may not import (``Engine.trust``)."""
    where = InstanceFilter(machine=machine, statuses=(PENDING, RUNNING, WAITING))
    records = engine.store.query(where, order="created", descending=False, limit=None)
    now = engine.clock()
    live = live_ids(engine.store.workers(), now, engine.lease_seconds)
    return [_entry(engine, rec, live) for rec in records]


def _commit(engine: Engine, e: Entry) -> StepCommit | None:
    """What ``apply`` writes for ``e``: its upcast, or the ``needs_migration`` mark."""
    if e.outcome == MIGRATE and e.upcast is not None:
        return migration.alone(e.upcast)
    rec = e.record
    if e.outcome == NEEDS and rec is not None and (rec.reason != migration.NEEDS_MIGRATION
                                                   or rec.last_error != e.cause):
        if rec.owner is None:
            return outcome.marked(rec, migration.NEEDS_MIGRATION, str(e.cause), engine.clock())
    return None


def apply(engine: Engine, entries: Sequence[Entry], *, batch: int = 100,
          on_batch: Callable[[list[Entry]], None] | None = None) -> list[Entry]:
    """Write what ``survey`` found, ``batch`` instances a transaction; set ``applied`` on
    each entry written (an instance that changed meanwhile is left, ``applied`` False).
    Returns the entries."""
    todo = [(e, c) for e in entries if (c := _commit(engine, e)) is not None]
    for start in range(0, len(todo), max(1, batch)):
        chunk = todo[start:start + batch]
        results = engine.ledger.apply([c for _, c in chunk])
        for (e, _), ok in zip(chunk, results, strict=False):
            e.applied = ok
        if on_batch is not None:
            on_batch([e for e, _ in chunk])
    return list(entries)
