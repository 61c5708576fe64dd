"""What a claim makes of each instance it takes (issue 37: the rules of a write are the
runtime's, the store only applies them): the claimer becomes the owner and, when the
instance was taken over from a dead owner in the middle of a step (not asleep in a retry
backoff), it counts one recovery; the runtime fails an instance whose recoveries without
progress exceed its limit (``crash_loop``).

Taking an instance over from another owner (dead, its lease expired, or gone without
giving it back) appends one history row of kind ``recovery`` (``takeover_row``) in the
claim's own transaction: source and destination are the state it stands in, no tokens, no
delta, and ``detail.recovery`` says who held it and who took it.  It is not a transition
(it counts neither against ``max_transitions`` nor as progress against ``crash_loop``).
Claiming an instance nobody holds, or one this owner already holds, writes no row.

``take`` is the ``ClaimRequest.adopt`` the ledger gives every ``Store.claim``
(``runtime.ledger``), which the store calls for each candidate inside its transaction;
``adopted`` / ``takeover_row`` are the same rules for a claim made by a commit
(``Ownership.adoption``).
"""

from __future__ import annotations

import operator
from dataclasses import fields
from typing import Any

from ...store.claims import ClaimRequest
from ...store.records import RATE_LIMITED, RECOVERY, RUNNING, SCHEDULED, WAITING, HistoryRow, InstanceRecord

_FIELDS = operator.attrgetter(*(f.name for f in fields(InstanceRecord)))


def worker_place(worker_id: str | None) -> tuple[str | None, int | None]:
    """``(host, pid)`` named by a worker id (``host:pid:nonce``, see ``runtime.fleet.liveness``);
    ``(None, None)`` when the id has another shape."""
    parts = (worker_id or "").rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None, None
    return parts[0], int(parts[1])


def adopted(rec: InstanceRecord, owner: str, now: float,
            prior_heartbeat: float | None) -> InstanceRecord:
    """``rec`` owned by ``owner`` (a copy; ``version`` unchanged: the store bumps it).

    ``prior_heartbeat`` is the last heartbeat of the previous owner (``None``
    when it has no row).  Taken over from another owner, the copy carries one
    more history row (``seq`` + 1; the row is ``takeover_row(rec, copy, …)``).
    Taken over while ``running`` and not asleep in a backoff (mid-step), the
    instance counts a recovery: ``recoveries`` grows by one when no step was
    committed since the last recovery (``recovered_seq == seq``), else restarts
    at 1; the recovery row itself is no progress (``recovered_seq`` moves past it).
    """
    new = InstanceRecord(*_FIELDS(rec))
    new.context, new.visits = dict(rec.context), dict(rec.visits)
    new.owner, new.updated_at = owner, now
    if new.status == SCHEDULED:  # due: it starts now
        new.next_attempt_at = None
    if new.status != WAITING:
        new.status = RUNNING
    elif rec.reason == RATE_LIMITED:  # its wait is over: it calls again
        new.status, new.reason = RUNNING, None
    if rec.owner is None or rec.owner == owner:
        return new
    new.seq = rec.seq + 1  # the takeover's history row
    same = rec.recovered_seq == rec.seq  # no step committed since the last recovery
    if mid_step(rec, prior_heartbeat):
        new.recoveries, new.recovered_seq = (rec.recoveries + 1 if same else 1), new.seq
    elif same:
        new.recovered_seq = new.seq
    return new


def mid_step(rec: InstanceRecord, prior_heartbeat: float | None) -> bool:
    """True when ``rec``'s owner was (as far as the store shows) running one of its steps:
    ``running`` and not asleep in a retry backoff."""
    sleeping = (rec.next_attempt_at is not None and prior_heartbeat is not None
                and rec.next_attempt_at > prior_heartbeat)
    return rec.status == RUNNING and not sleeping


def takeover_row(rec: InstanceRecord, new: InstanceRecord, now: float,
                 prior_heartbeat: float | None, cause: str) -> HistoryRow | None:
    """The ``recovery`` history row of ``new`` = ``adopted(rec, …)`` (``None`` when no
    other owner held ``rec``).

    ``detail.recovery``: ``from`` / ``to`` (worker ids), ``from_host`` / ``from_pid`` /
    ``to_host`` / ``to_pid`` (from the ids; ``None`` when unknown), ``cause``
    (``process_gone``, ``lease_expired``, ``deregistered``), ``status`` (the instance's
    status when taken), ``mid_step`` (it was in the middle of a step, which runs again),
    ``last_heartbeat`` (the previous owner's, epoch s, or ``None``) and ``recoveries``
    (mid-step takeovers without progress so far, the ``crash_loop`` count).
    """
    if rec.owner is None or rec.owner == new.owner:
        return None
    (from_host, from_pid), (to_host, to_pid) = worker_place(rec.owner), worker_place(new.owner)
    info = {"from": rec.owner, "from_host": from_host, "from_pid": from_pid,
            "to": new.owner, "to_host": to_host, "to_pid": to_pid, "cause": cause,
            "status": rec.status, "mid_step": mid_step(rec, prior_heartbeat),
            "last_heartbeat": prior_heartbeat, "recoveries": new.recoveries}
    return HistoryRow(instance_id=rec.id, seq=new.seq, source=rec.state, dest=rec.state,
                      trigger=RECOVERY, at=now, kind=RECOVERY, detail={"recovery": info},
                      machine_version=rec.machine_version)


def cause(request: ClaimRequest, prior_owner: str, prior_heartbeat: float | None) -> str:
    """Why ``prior_owner`` no longer holds its instances, as ``request`` sees it (for the
    takeover's history row): ``process_gone`` (in ``dead``), ``deregistered`` (no worker
    row) or ``lease_expired``."""
    if prior_owner in request.dead:
        return "process_gone"
    return "deregistered" if prior_heartbeat is None else "lease_expired"


def take(rec: InstanceRecord, request: ClaimRequest, prior_heartbeat: float | None
         ) -> tuple[InstanceRecord, HistoryRow | None]:
    """``ClaimRequest.adopt``: what ``Store.claim`` writes for one candidate it takes, the
    adopted record and its takeover row (``None`` when the claim takes over from nobody)."""
    why = cause(request, rec.owner or "", prior_heartbeat)
    new = adopted(rec, request.owner, request.now, prior_heartbeat)
    return new, takeover_row(rec, new, request.now, prior_heartbeat, why)


def claim_request(owner: str, now: float, **options: Any) -> ClaimRequest:
    """A ``ClaimRequest`` (``options``: its other fields) carrying this module's rule
    (``adopt=take``), as ``Ledger.claim`` sends it: for a direct ``Store.claim`` (the store
    contract)."""
    return ClaimRequest(owner, now, adopt=take, **options)
