"""What a claim selects and how it writes: the pure part of ``Store.claim`` shared by
every backend.

A worker claims an instance that is runnable (``pending`` or ``running``, due
now, ``waiting`` with a timer that is due: a review's SLA, or ``scheduled`` and due: a
delayed or debounced start, never before its time even for a resume) and not leased by
anyone else: no owner, or an owner whose lease has expired or who is known dead.  What the
claim makes of each instance it takes (its owner, a recovery counted, a takeover's history
row) is the runtime's rule, given with the request (``ClaimRequest.adopt``:
``runtime.fleet.adoption.take``, set by ``Ledger.claim``); the store applies it to each
candidate inside its transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import StartKeyTaken
from . import leases
from .records import HistoryRow, InstanceRecord

#: Reasons a worker gives when it leaves an instance alone because it cannot run it.
MACHINE_UNAVAILABLE, FINGERPRINT_MISMATCH = "machine_unavailable", "fingerprint_mismatch"


#: ``adopt(rec, request, prior_heartbeat) -> (claimed record, takeover row or None)``.
Adopt = Callable[[InstanceRecord, "ClaimRequest", "float | None"],
                 tuple[InstanceRecord, "HistoryRow | None"]]


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
        queues: only instances in these queues (``None``: any queue).
        skip_queues: never instances in these queues (served by claims of their own).
        queue_limit: at most this many live leases of the one queue in ``queues``,
            counted over every worker inside the claim's transaction (serialised by a
            lock per queue: an advisory lock on PostgreSQL, the write lock on SQLite).
        partition_limit: at most this many live leases per partition key over every
            worker (instances without a key are not limited); the free slots go to
            partitions least loaded first, round-robin, so a small tenant is never
            starved by a big one.
        adopt: the runtime's rule for each candidate taken (``Adopt``); a claim without
            one is refused (``ValueError``): claims go through ``Ledger.claim``, which
            gives ``runtime.fleet.adoption.take``.
    """

    owner: str
    now: float
    limit: int = 100
    lease_seconds: float = 10.0
    dead: Sequence[str] = ()
    due_by: float | None = None
    own: bool = False
    machines: Sequence[str] | None = None
    queues: Sequence[str] | None = None
    skip_queues: Sequence[str] = ()
    queue_limit: int | None = None
    partition_limit: int | None = None
    adopt: Adopt | None = None

    def adopted(self, rec: InstanceRecord, prior_heartbeat: float | None
                ) -> tuple[InstanceRecord, HistoryRow | None]:
        """``adopt`` applied to candidate ``rec`` (its owner's last heartbeat
        ``prior_heartbeat``, ``None``: no row): the record to store, ``version`` not yet
        bumped, and its takeover row or ``None``; ``ValueError`` without ``adopt``."""
        if self.adopt is None:
            raise ValueError("ClaimRequest.adopt is not set: a claim goes through Ledger.claim")
        return self.adopt(rec, self, prior_heartbeat)

    @property
    def due(self) -> float:
        """The due-by time as a number."""
        return self.now if self.due_by is None else self.due_by


#: ``where``'s status terms, one per arm: (the SQLite index that answers it, its term).  Each
#: takes one argument, ``where``'s first three in this order: the due-by time, then ``now``
#: twice.
ARMS = (("idx_instances_status", "i.status IN ('pending', 'running') AND "
         "(i.next_attempt_at IS NULL OR i.next_attempt_at <= ?)"),
        ("idx_instances_timers", "i.status = 'waiting' AND i.next_attempt_at <= ?"),
        ("idx_instances_status", "i.status = 'scheduled' AND i.next_attempt_at <= ?"))
#: ``where``'s leading term: the OR of the arms (``by_arm`` reads each arm alone instead).
STATUS = f"({' OR '.join(term for _, term in ARMS)})"


def where(req: ClaimRequest) -> tuple[str, list[object]]:
    """The WHERE clause (``?`` placeholders) selecting claimable rows of ``instances i``,
    and its arguments.

    Its status terms are three arms, each one index can answer (SQLite: a MULTI-INDEX OR):
    the runnable, the waiting whose timer is due (``idx_instances_timers``: 10,000 instances
    waiting on timers cost one index search per poll, not a walk of every waiting row, as a
    leading ``status IN (...live)`` term made SQLite do) and the scheduled that are due.
    PostgreSQL's ``take`` adds that leading ``schema.LIVE`` term, which its planner needs to
    walk the partial rank index in claim order (``ORDER``).  The owner's
    lease is tested by a correlated subquery, not a join: PostgreSQL
    re-evaluates it against the newest row version when a concurrent claim
    committed first, whereas a LEFT JOIN would be rechecked with the stale,
    NULL-extended owner row and hand the instance out twice.
    """
    owners = ["i.owner IS NULL",
              "NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = i.owner AND "
              "COALESCE(w.lease_until, w.heartbeat_at + ?) >= ?)"]
    args: list[object] = [req.due, req.now, req.now, req.lease_seconds, req.now]
    if req.own:
        owners.append("i.owner = ?")
        args.append(req.owner)
    if req.dead:
        owners.append(f"i.owner IN ({', '.join('?' * len(req.dead))})")
        args.extend(req.dead)
    sql = f"{STATUS} AND ({' OR '.join(owners)})"
    if req.machines is not None:
        sql += f" AND i.machine IN ({', '.join('?' * len(req.machines)) or 'NULL'})"
        args.extend(req.machines)
    if req.queues is not None:
        sql += f" AND i.queue IN ({', '.join('?' * len(req.queues)) or 'NULL'})"
        args.extend(req.queues)
    if req.skip_queues:
        sql += f" AND i.queue NOT IN ({', '.join('?' * len(req.skip_queues))})"
        args.extend(req.skip_queues)
    return sql, args


def by_arm(cond: str, args: Sequence[object], columns: str = "i.key, i.rank"
           ) -> tuple[str, list[object]]:
    """SQLite: ``columns`` of the rows matching ``cond`` (``where``'s, maybe narrowed; its
    ``args``), read arm by arm (``ARMS``), each through its own index (``INDEXED BY``), as
    one ``UNION ALL`` (the arms' statuses are disjoint), and the arguments.

    Why not ``cond`` alone: SQLite plans its OR of arms as a MULTI-INDEX OR only while no
    other term looks better.  A worker's ``machine IN (...)`` term did (the machine index
    by machine alone: every instance the machine ever had, finished ones included), and so
    did a full scan once ``ANALYZE`` had counted a table of mostly finished rows (its
    statistics say ~half the rows per status).  Pinned, a claim reads only rows that are
    runnable, waiting and due, or scheduled: ``tests/store/test_claim_reads_live_rows.py``.
    The waiting arm is read from its index alone (``schema.TIMERS_INDEX`` covers what it
    tests), so a burst of 10,000 due timers is ranked without reading their rows."""
    if not cond.startswith(STATUS + " AND "):
        raise ValueError("by_arm reads a condition made by claims.where")
    rest, more = cond[len(STATUS) + 5:], args[len(ARMS):]  # each arm tests its own status
    sql = " UNION ALL ".join(f"SELECT {columns} FROM instances i INDEXED BY {index} "
                             f"WHERE {term} AND {rest}" for index, term in ARMS)
    return sql, [a for k in range(len(ARMS)) for a in (args[k], *more)]


def next_due(now: float, machines: Sequence[str] | None) -> tuple[str, list[object]]:
    """``Store.next_due``'s read (``?`` placeholders) and its arguments: the least of two
    minimums, one per timed arm of ``where``'s status terms, so that each can use its index
    (the waiting arm ``idx_instances_timers``: one seek for 10,000 waiting; the scheduled
    arm the status index)."""
    where, extra = "", []
    if machines is not None:
        where = f" AND machine IN ({', '.join('?' * len(machines)) or 'NULL'})"
        extra = list(machines)
    arms = [f"SELECT MIN(next_attempt_at) AS due FROM instances WHERE {cond} "
            f"AND next_attempt_at > ?{where}"
            for cond in ("status = 'waiting'", "status = 'scheduled'")]
    return (f"SELECT MIN(due) FROM ({' UNION ALL '.join(arms)}) AS arms",
            [a for _ in arms for a in (now, *extra)])


def key_taken(records: Sequence[InstanceRecord]) -> StartKeyTaken:
    """The refusal of a ``Store.create`` of ``records`` whose unique start-key index refused
    one: the first with a key (a batch start gives keys to one record at most)."""
    rec = next((r for r in records if r.start_key is not None), records[0])
    return StartKeyTaken(rec.machine, rec.start_key or "")


def leased(req: ClaimRequest) -> tuple[str, list[object]]:
    """The WHERE clause selecting rows of ``instances i`` under a live lease (an owner
    whose lease holds and who is not known dead), and its arguments."""
    sql = ("i.owner IS NOT NULL AND i.status IN ('pending', 'running') AND EXISTS "
           "(SELECT 1 FROM workers w WHERE w.id = i.owner AND "
           "COALESCE(w.lease_until, w.heartbeat_at + ?) >= ?)")
    args: list[object] = [req.lease_seconds, req.now]
    if req.dead:
        sql += f" AND i.owner NOT IN ({', '.join('?' * len(req.dead))})"
        args.extend(req.dead)
    return sql, args


class ClaimTxn(Protocol):
    """What ``claim`` needs of a backend, inside the claim's one transaction."""

    def rows(self, sql: str, args: Sequence[object]) -> list[Sequence[Any]]:
        """All rows of a read (``?`` placeholders)."""

    def lock(self, name: str) -> None:
        """Serialise with every other claim taking ``name`` until this transaction ends."""

    def take(self, cond: str, args: Sequence[object], limit: int) -> list[InstanceRecord]:
        """Claim up to ``limit`` rows matching ``cond`` in claim order (``ORDER``: priority,
        then age; see ``adopted``)."""

    def among(self, cond: str, args: Sequence[object], columns: str
              ) -> tuple[str, list[object]]:
        """A ``SELECT`` of ``columns`` of the rows matching ``cond`` (``where``'s), to read
        from as a subquery, and its arguments (SQLite: ``by_arm``)."""


def claim(req: ClaimRequest, txn: ClaimTxn) -> list[InstanceRecord]:
    """``Store.claim`` over a backend's transaction: the queue's and the partitions'
    limits applied to what ``req`` asks for."""
    cond, args = where(req)
    limit = req.limit
    if req.queue_limit is not None:
        if req.queues is None or len(req.queues) != 1:
            raise ValueError("a queue_limit applies to exactly one queue")
        txn.lock(f"fsm_queue:{req.queues[0]}")
        live, live_args = leased(req)
        held = txn.rows(f"SELECT COUNT(*) FROM instances i WHERE i.queue = ? AND {live}",
                        [req.queues[0], *live_args])[0][0]
        limit = min(limit, req.queue_limit - int(held))
    if limit <= 0:
        return []
    if req.partition_limit is None:
        return txn.take(cond, args, limit)
    txn.lock("fsm_partitions")
    live, live_args = leased(req)
    loads = {row[0]: int(row[1]) for row in txn.rows(
        f"SELECT i.partition_key, COUNT(*) FROM instances i WHERE i.partition_key IS NOT NULL "
        f"AND {live} GROUP BY i.partition_key", live_args)}
    rows, rows_args = txn.among(cond, args, "i.partition_key, i.rank")
    groups = [(row[0], float(row[1]), int(row[2])) for row in txn.rows(
        f"SELECT partition_key, MIN(rank), COUNT(*) FROM ({rows}) AS c GROUP BY partition_key",
        rows_args)]
    out: list[InstanceRecord] = []
    for key, n in share(groups, loads, req.partition_limit, limit):
        extra, more = ("i.partition_key IS NULL", []) if key is None else \
            ("i.partition_key = ?", [key])
        out += txn.take(f"{cond} AND {extra}", [*args, *more], n)
    return out


def takeable(req: ClaimRequest, found: list[tuple[InstanceRecord, float | None]],
             txn: ClaimTxn) -> list[tuple[InstanceRecord, float | None]]:
    """Of a claim's candidates (each with its owner's last heartbeat, ``None``: no row),
    those it may take: it ends the lease of every expired owner it takes from, in its
    transaction (``leases.ending``: no renewal of that owner succeeds afterwards), and
    drops the candidates of an owner that renewed meanwhile.  Unowned ones, its own,
    those of an owner without a row or known dead are kept as they are."""
    owners = sorted({rec.owner for rec, prior in found
                     if rec.owner is not None and rec.owner != req.owner
                     and rec.owner not in req.dead and prior is not None})
    if not owners:
        return found
    sql, args = leases.ending(owners, req.now, req.lease_seconds)
    renewed = set(owners) - {row[0] for row in txn.rows(sql, args)}
    return [(rec, prior) for rec, prior in found if rec.owner not in renewed]


def share(groups: Sequence[tuple[str | None, float, int]], loads: dict[str, int],
          per_key: int, limit: int) -> list[tuple[str | None, int]]:
    """How many of ``limit`` slots each partition gets: ``groups`` are (key, first
    instance's claim rank, runnable count); ``loads`` the live leases per key.  Least loaded
    first (then oldest), one slot per partition per round; a key never goes past
    ``per_key`` leases, instances without a key (``None``) are not limited."""
    order = sorted(groups, key=lambda g: (loads.get(g[0], 0) if g[0] is not None else 0, g[1]))
    room = {g[0]: g[2] if g[0] is None else min(g[2], per_key - loads.get(g[0], 0))
            for g in order}
    given = dict.fromkeys(room, 0)
    left = limit
    while left > 0:
        turn = [k for k in room if given[k] < room[k]]
        if not turn:
            break
        for k in turn[:left]:
            given[k] += 1
        left -= min(left, len(turn))
    return [(k, n) for k, n in given.items() if n > 0]


#: The claim order (``ClaimTxn.take``): the lowest ``rank`` (``created_at - priority *
#: AGING_S``, ``records.AGING_S``) first, creation order among equals.
ORDER = " ORDER BY i.rank, i.key"


def select(columns: tuple[str, ...]) -> str:
    """``SELECT`` of a claim's candidates (``where`` follows it)."""
    return (f"SELECT {', '.join('i.' + c for c in columns)}, "
            "(SELECT w.heartbeat_at FROM workers w WHERE w.id = i.owner) AS prior_heartbeat "
            "FROM instances i WHERE ")


def grouped(rows: Sequence[tuple[tuple[str, ...], Sequence[Any], Any]]
            ) -> list[tuple[tuple[str, ...], tuple[Any, ...], list[Any]]]:
    """A claim's row writes (``(columns, values, key)`` each: ``codec.scalar_changes``)
    grouped by the columns and values they set, ``(columns, values, keys)`` each, so that
    each group is one ``UPDATE … WHERE key IN (…)`` (``by_keys``): most rows of a claim set
    the same (owner, time, status), and a statement per row cost PostgreSQL a parse, plan
    and index walk each (claims of 512 due timers: 37–49 ms).  No version compare: the
    claim's transaction holds these rows from its read on (SQLite's write lock, PostgreSQL's
    ``FOR UPDATE``), so no other write came between."""
    groups: dict[tuple[tuple[str, ...], tuple[Any, ...]], list[Any]] = {}
    for cols, values, key in rows:
        groups.setdefault((cols, tuple(values)), []).append(key)
    return [(cols, values, keys) for (cols, values), keys in groups.items()]


def by_keys(cols: tuple[str, ...], n: int | None) -> str:
    """The UPDATE of ``grouped``'s one group (``?`` placeholders: the values, then the
    ``n`` keys, or with ``n=None`` one array of them, ``key = ANY(?)``: PostgreSQL, one
    statement text for any group's size); the version moves on as a step's does."""
    sets = "".join(f"{col}=?, " for col in cols)
    keys = "key = ANY(?)" if n is None else f"key IN ({', '.join('?' * n)})"
    return f"UPDATE instances SET {sets}version=version+1 WHERE {keys}"
