"""What a claim writes: the pure part of ``Store.claim`` shared by every backend.

A worker claims an instance that is runnable (``pending`` or ``running``, due
now, or ``waiting`` with a timer that is due: a review's SLA) and not leased by anyone else: no owner, or an owner whose lease has
expired or who is known dead.  Claiming makes the claimer the owner and, when
the instance was taken over from a dead owner in the middle of a step (not
asleep in a retry backoff), counts one recovery; the runtime fails an instance
whose recoveries without progress exceed its limit (``crash_loop``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import Sequence

from .records import RUNNING, WAITING, InstanceRecord

_FIELDS = operator.attrgetter(*(f.name for f in fields(InstanceRecord)))

#: Reasons a worker gives when it leaves an instance alone because it cannot run it.
MACHINE_UNAVAILABLE, FINGERPRINT_MISMATCH = "machine_unavailable", "fingerprint_mismatch"


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a worker asks of ``Store.claim``.

    Args:
        owner: the claiming worker's id.
        now: the claimer's clock (epoch seconds): leases that ended before it are expired.
        limit: most instances to claim.
        lease_seconds: the lease of an owner row without ``lease_until`` (format < 3).
        dead: worker ids the claimer knows are dead (e.g. a gone pid on its own host),
            whose leases count as expired.
        due_by: claim only instances whose next attempt is due by then (``None``: ``now``;
            ``float("inf")``: also those still in a retry backoff).
        own: also claim instances this owner already holds (a resume by the same engine).
        machines: only instances of these machine names (``None``: any).
    """

    owner: str
    now: float
    limit: int = 100
    lease_seconds: float = 10.0
    dead: Sequence[str] = ()
    due_by: float | None = None
    own: bool = False
    machines: Sequence[str] | None = None

    @property
    def due(self) -> float:
        """The due-by time as a number."""
        return self.now if self.due_by is None else self.due_by


def where(req: ClaimRequest) -> tuple[str, list[object]]:
    """The WHERE clause (``?`` placeholders) selecting claimable rows of ``instances i``,
    and its arguments.

    The owner's lease is tested by a correlated subquery, not a join: PostgreSQL
    re-evaluates it against the newest row version when a concurrent claim
    committed first, whereas a LEFT JOIN would be rechecked with the stale,
    NULL-extended owner row and hand the instance out twice.
    """
    owners = ["i.owner IS NULL",
              "NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = i.owner AND "
              "COALESCE(w.lease_until, w.heartbeat_at + ?) >= ?)"]
    args: list[object] = [req.due, req.now, req.lease_seconds, req.now]
    if req.own:
        owners.append("i.owner = ?")
        args.append(req.owner)
    if req.dead:
        owners.append(f"i.owner IN ({', '.join('?' * len(req.dead))})")
        args.extend(req.dead)
    sql = ("(i.status IN ('pending', 'running') AND (i.next_attempt_at IS NULL OR "
           "i.next_attempt_at <= ?) OR i.status = 'waiting' AND i.next_attempt_at <= ?) "
           f"AND ({' OR '.join(owners)})")
    if req.machines is not None:
        sql += f" AND i.machine IN ({', '.join('?' * len(req.machines)) or 'NULL'})"
        args.extend(req.machines)
    return sql, args


def select(columns: tuple[str, ...]) -> str:
    """``SELECT`` of a claim's candidates (``where`` follows it)."""
    return (f"SELECT {', '.join('i.' + c for c in columns)}, "
            "(SELECT w.heartbeat_at FROM workers w WHERE w.id = i.owner) AS prior_heartbeat "
            "FROM instances i WHERE ")


def adopted(rec: InstanceRecord, owner: str, now: float,
            prior_heartbeat: float | None) -> InstanceRecord:
    """``rec`` owned by ``owner`` (a copy; ``version`` unchanged: the store bumps it).

    ``prior_heartbeat`` is the last heartbeat of the previous owner (``None``
    when it has no row).  Taken over from another owner while ``running`` and
    not asleep in a backoff, the instance counts a recovery: ``recoveries``
    grows by one when no step was committed since the last recovery
    (``recovered_seq == seq``), else restarts at 1.
    """
    new = InstanceRecord(*_FIELDS(rec))
    new.context, new.visits = dict(rec.context), dict(rec.visits)
    new.owner, new.updated_at = owner, now
    if new.status != WAITING:
        new.status = RUNNING
    if rec.owner is None or rec.owner == owner:
        return new
    sleeping = (rec.next_attempt_at is not None and prior_heartbeat is not None
                and rec.next_attempt_at > prior_heartbeat)
    if rec.status == RUNNING and not sleeping:
        same = rec.recovered_seq == rec.seq
        new.recoveries, new.recovered_seq = (rec.recoveries + 1 if same else 1), rec.seq
    return new
