"""Worker leases: the renewal and the end of a lease, shared SQL of every backend.

A worker's row holds the lease of every instance it owns until ``lease_until``
(epoch seconds on the worker's own clock, ``time.time()``).  A lease is
renewed only while it holds (``renewal``): a worker that was paused past its
lease (SIGSTOP, a long GC, a partition) is refused and has lost its
instances; it must register again under a new id.  A lease ends for good
when another worker takes one of its instances over (``ending``): the claim,
in its own transaction, sets ``lease_until`` to the owner's last heartbeat,
a value no renewal accepts (``lease_until > heartbeat_at`` holds for every
lease a renewal wrote, since ``lease_seconds > 0``).

Why both, and not a time comparison alone: the claimer judges expiry by its
clock (``ClaimRequest.now``) and the renewer by its own, each read before
its transaction runs, so "expired" for one and "not yet" for the other can
both be true at once (the race seen at 2,000 instances: a heartbeat renewed
a row a concurrent claim had read as expired; both committed, and the old
owner kept a fresh lease on instances it no longer held).  Writing the end
into the row makes the two statements meet on one row, and the database
orders them:

* SQLite: every write is ``BEGIN IMMEDIATE``; the claim and the renewal run
  one after the other, and the second sees what the first wrote.
* PostgreSQL (READ COMMITTED): both are ``UPDATE``\\ s of the same worker row,
  so the second waits for the first's row lock and then, the row having
  changed, re-evaluates its ``WHERE`` on the committed new version
  (EvalPlanQual).  Claim first: the renewal re-checks ``lease_until >
  heartbeat_at`` on the ended row and updates nothing.  Renewal first: the
  claim's ``ending`` re-checks the expiry on the renewed row, does not return
  the owner, and the claim drops that owner's candidates (their rows were
  locked ``FOR UPDATE`` but are left unchanged).  A plain ``SELECT … FOR
  SHARE`` of the owner row would not do: a lock without a new row version
  triggers no re-check, and a renewal that had evaluated its ``WHERE`` just
  before the lock would go on to commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from .codec import dumps
from .records import WorkerRow

#: A renewal (``?`` placeholders): the worker's new heartbeat, lease and queues, applied
#: only while its stored lease still holds at the renewer's ``now`` and was never ended.
RENEW = ("UPDATE workers SET heartbeat_at = ?, lease_until = ?, queues = ? "
         "WHERE id = ? AND lease_until > heartbeat_at AND lease_until >= ?")


def renewal(worker: WorkerRow, now: float) -> list[object]:
    """``RENEW``'s arguments: ``worker``'s new ``heartbeat_at``/``lease_until``/``queues``,
    refused when the stored lease ended before ``now`` (the renewer's clock)."""
    return [worker.heartbeat_at, worker.lease_until, dumps(worker.queues or []), worker.id, now]


def ending(owners: Sequence[str], now: float, lease_seconds: float) -> tuple[str, list[object]]:
    """The ``UPDATE … RETURNING id`` ending the leases of those ``owners`` whose lease ran
    out before ``now`` (the claimer's clock; a row without ``lease_until``, from before
    format 3, holds ``lease_seconds`` after its heartbeat), and its arguments.  The ids
    it returns are the owners whose instances may be taken; an owner it leaves out
    renewed meanwhile (or never had a row: nothing to end, nothing can renew it)."""
    marks = ", ".join("?" * len(owners))
    sql = (f"UPDATE workers SET lease_until = heartbeat_at WHERE id IN ({marks}) AND "
           "COALESCE(lease_until, heartbeat_at + ?) < ? RETURNING id")
    return sql, [*owners, lease_seconds, now]
