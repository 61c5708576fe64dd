"""PostgreSQL store (psycopg 3): the same records and contract as the SQLite store.

Reads and writes take a connection from a small pool of idle ones (opened on
demand, one per call in progress: the group commit's thread, a breaker's or an
outbox call's thread and the event loop's each have their own, so none waits
behind another's transaction; at most ``MAX_IDLE`` are kept once calls end), the
heartbeat has its own, and once a worker
waits for work one more ``LISTEN``s on ``fsm_work``.  ``commit`` is a group commit:
a worker's batch (owned instances, one step each) is one statement, one round trip
(``pg_commit``); any other batch sends its compare-and-set UPDATEs in one pipeline,
then the applied steps' history, attempt and outbox rows in another, all in one
transaction.  Either way each step is all-or-nothing and fenced by its version.
``claim`` takes rows with ``SELECT … FOR UPDATE SKIP LOCKED``: concurrent
claimers skip each other's rows instead of waiting on them.  A dropped
connection (the server restarted) surfaces as ``StoreError`` once (the idle
ones are dropped with it); the next call reconnects.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ...errors import StoreError
from ...process import session_name
from .. import claims, leases, pg_fence, pg_read, rates
from ..claims import ORDER, ClaimRequest, select
from ..codec import (
    ATTEMPT,
    BREAKER,
    CLAIM_REVIEW,
    HISTORY,
    INSTANCE,
    PUT_REPLY,
    REPLY,
    REVIEW,
    SELECT_REPLY,
    SELECT_REVIEWS,
    WORKER,
    marks,
    reviews_where,
    scalar_changes,
)
from ..rates import RateRequest
from ..records import (
    AttemptRow,
    BreakerRow,
    HistoryRow,
    InstanceFilter,
    InstanceRecord,
    OutboxBegin,
    OutboxRow,
    ReplyRow,
    ReviewItem,
    StepRow,
    WorkerRow,
)
from ..schema import LIVE
from ..sql_base import SqlPlain
from .connect import (
    _SQL_ATTEMPTS,
    _SQL_BREAKER,
    _SQL_HISTORY,
    _SQL_INSERT_HISTORY,
    _SQL_OUTBOX,
    _SQL_OUTBOX_BEGIN,
    _SQL_PUT_WORKER,
    _SQL_RENEW,
    _SQL_WORKERS,
    CHANNEL,
    OUTBOX,
)
from .steps import PostgresSteps
from .streams import PostgresStreams


class PostgresStore(PostgresSteps, PostgresStreams, SqlPlain):
    """A ``Store`` on a PostgreSQL database.

    Args:
        url: ``postgresql://user:password@host:port/dbname`` (libpq URI; ``PG*``
            environment variables fill in what it leaves out).
        create: create the schema in an empty database (else ``StoreError``).
        connect_timeout: seconds to wait for the server when connecting.
        readonly: every transaction is read-only (``default_transaction_read_only``; a
            write fails with ``StoreError``) and the schema is never migrated: an older
            one is refused with a hint (the viewer's mode).

    Raises:
        StoreError: unreachable server, failed authentication, a newer schema.
        NotAnFsmDatabase: the database holds another application's tables.
    """


    remote = True

    def history(self, instance_id: str) -> builtins.list[HistoryRow]:
        self.get(instance_id)
        return [self._expand(HISTORY.decode(r)) for r in self._rows(_SQL_HISTORY, (instance_id,))]

    def attempts(self, instance_id: str) -> builtins.list[AttemptRow]:
        return [ATTEMPT.decode(r) for r in self._rows(_SQL_ATTEMPTS, (instance_id,))]

    # -- outbox -----------------------------------------------------------------------
    def outbox_begin(self, key: str, instance_id: str, state: str, visit: int,
                     now: float) -> OutboxRow:
        return self.outbox_begins([OutboxBegin(key, instance_id, state, visit, now)])[0]

    def outbox_begins(self, begins: Sequence[OutboxBegin]) -> builtins.list[OutboxRow]:
        """One transaction, one pipeline: each upsert returns its row, or nothing for a row
        already done, which is then read (rare: a replayed side effect)."""
        if not begins:
            return []

        def go(conn: psycopg.Connection[Any]) -> builtins.list[dict[str, Any]]:
            with conn.pipeline():
                curs = [conn.cursor(row_factory=dict_row).execute(
                    _SQL_OUTBOX_BEGIN, (b.key, b.instance_id, b.state, b.visit, b.now, b.now))
                    for b in begins]
            rows = [cur.fetchone() for cur in curs]
            for i, row in enumerate(rows):
                if row is None:  # already done: nothing changed
                    rows[i] = conn.cursor(row_factory=dict_row).execute(
                        _SQL_OUTBOX + " WHERE key=%s", (begins[i].key,)).fetchone()
            return rows  # type: ignore[return-value]
        return [OUTBOX.decode(r) for r in self._run(go, txn=True)]

    def outbox(self, instance_id: str | None = None) -> builtins.list[OutboxRow]:
        sql, args = _SQL_OUTBOX, ()  # type: tuple[str, tuple[str, ...]]
        if instance_id is not None:
            sql, args = sql + " WHERE instance_id=%s", (instance_id,)
        return [OUTBOX.decode(r) for r in self._rows(sql + " ORDER BY ord", args)]

    # -- leases -----------------------------------------------------------------------
    def claim(self, request: ClaimRequest) -> builtins.list[InstanceRecord]:
        return self._full(self._run(
            lambda conn: claims.claim(request, _ClaimTxn(conn, request)), txn=True))

    def held(self, owner: str) -> dict[str, str]:
        def go(conn: psycopg.Connection[Any]) -> dict[str, str]:
            cur = conn.execute("SELECT id, status FROM instances WHERE owner=%s", (owner,))
            return {r[0]: r[1] for r in cur.fetchall()}
        return self._on_side(go)

    def release(self, owner: str, ids: Sequence[str] | None = None, *, now: float) -> int:
        if ids is not None and not ids:
            return 0
        sql = "UPDATE instances SET owner=NULL, version=version+1, updated_at=%s WHERE owner=%s"
        args: builtins.list[Any] = [now, owner]
        if ids is not None:
            sql += " AND id = ANY(%s)"
            args.append(builtins.list(ids))

        def go(conn: psycopg.Connection[Any]) -> int:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                count = cur.rowcount
                if count:
                    cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            return count
        return self._run(go, txn=True)

    def wait_for_work(self, timeout: float) -> None:
        """Waits for a NOTIFY on ``fsm_work`` (a created or released instance) up to
        ``timeout`` seconds; when the listening connection cannot be had, sleeps instead."""
        try:
            listener = self._listening()
            for _ in listener.notifies(timeout=max(0.0, timeout), stop_after=1):
                break
        except (psycopg.Error, StoreError):
            if self._listener is not None:
                self._listener.close()
            self._listener = None
            time.sleep(max(0.0, timeout))

    def _listening(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed or self._listener.broken:
            self._listener = self._connect()
            self._listener.execute(f"LISTEN {CHANNEL}")
        return self._listener

    # -- workers ------------------------------------------------------------------------
    def put_worker(self, worker: WorkerRow) -> None:
        self._on_side(lambda conn: conn.execute(_SQL_PUT_WORKER, WORKER.values(worker)))

    def renew_worker(self, worker: WorkerRow, now: float) -> bool:
        # autocommit, one UPDATE on the heartbeat's connection: see ``store.leases`` for
        # why a concurrent claim and this can never both succeed
        return self._on_side(
            lambda conn: conn.execute(_SQL_RENEW, leases.renewal(worker, now)).rowcount == 1)

    def end_lease(self, worker_id: str, now: float, lease_seconds: float) -> bool:
        sql, args = leases.ending([worker_id], now, lease_seconds)

        def go(conn: psycopg.Connection[Any]) -> bool:
            if conn.execute(marks(sql), args).fetchall():
                return True
            return not conn.execute("SELECT 1 FROM workers WHERE id=%s", (worker_id,)).fetchall()
        return self._run(go, txn=True)

    def fence(self, now: float, lease_seconds: float) -> int:
        rows = self._on_side(
            lambda conn: conn.execute(pg_fence.FENCE, (session_name(), pg_read.IDLE_IN_TRANSACTION_S,
                                                    lease_seconds, now)).fetchall())
        return sum(1 for _, ended in rows if ended)

    def workers(self) -> builtins.list[WorkerRow]:
        out = []
        for row in self._rows(_SQL_WORKERS):
            worker = WORKER.decode(row)
            worker.queues = worker.queues or []
            out.append(worker)
        return out

    # -- reply cache -------------------------------------------------------------------
    def get_reply(self, key: str, not_before: float) -> ReplyRow | None:
        rows = self._rows(marks(SELECT_REPLY), (key, not_before))
        return REPLY.decode(rows[0]) if rows else None

    def put_reply(self, row: ReplyRow) -> None:
        self._run(lambda conn: conn.execute(marks(PUT_REPLY), REPLY.values(row)))

    # -- review queue -------------------------------------------------------------------
    def reviews(self, *, statuses: Sequence[str] | None = None, machine: str | None = None,
                instance_id: str | None = None,
                id_prefix: str | None = None) -> builtins.list[ReviewItem]:
        sql, args = reviews_where(statuses, machine, instance_id, id_prefix)
        return [REVIEW.decode(r) for r in self._rows(marks(SELECT_REVIEWS + sql), args)]

    def claim_review(self, item_id: str, by: str, now: float) -> bool:
        return self._run(lambda conn: conn.execute(
            marks(CLAIM_REVIEW), (by, now, item_id, by)).rowcount == 1, txn=True)

    # -- circuit breakers -------------------------------------------------------------
    def get_breaker(self, name: str) -> BreakerRow:
        rows = self._rows(_SQL_BREAKER, (name,))
        return BREAKER.decode(rows[0]) if rows else BreakerRow(name)

    def put_breaker(self, row: BreakerRow, expected_version: int) -> bool:
        name, state, events, opened_at, probe_at, _ = BREAKER.values(row)
        version = expected_version + 1
        if expected_version == 0:
            sql = marks(BREAKER.insert_sql("breakers")) + " ON CONFLICT (name) DO NOTHING"
            args: tuple[Any, ...] = (name, state, events, opened_at, probe_at, version)
        else:
            sql = ("UPDATE breakers SET state=%s, events=%s, opened_at=%s, probe_at=%s, "
                   "version=%s WHERE name=%s AND version=%s")
            args = (state, events, opened_at, probe_at, version, name, expected_version)
        ok = self._run(lambda conn: conn.execute(sql, args).rowcount == 1)
        if ok:
            row.version = version
        return ok

    # -- rate limits --------------------------------------------------------------------
    def rate_acquire(self, request: RateRequest) -> tuple[float, str]:
        def go(conn: psycopg.Connection[Any]) -> tuple[float, str]:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                         ("fsm_rate:" + request.name,))

            def execute(sql: str, args: Sequence[Any]) -> builtins.list[Any]:
                cur = conn.execute(marks(sql), args)
                return cur.fetchall() if cur.description else []
            return rates.acquire(request, execute)
        return self._run(go, txn=True)

    # -- the shared SQL's primitives (``store.sql_base``; ``?`` marks become ``%s``) --------
    def _sql_rows(self, sql: str, args: Sequence[Any] = ()) -> builtins.list[Any]:
        return self._run(lambda conn: conn.execute(marks(sql), args or None).fetchall())

    def _sql_write(self, *statements: tuple[str, Sequence[Any]]) -> builtins.list[int]:
        def go(conn: psycopg.Connection[Any]) -> builtins.list[int]:
            return [conn.execute(marks(sql), args or None).rowcount for sql, args in statements]
        return self._run(go, txn=True)

    def _sql_write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._run(lambda conn: conn.cursor().executemany(marks(sql), rows), txn=True)

    # -- read side (SQL in ``pg_read``) ----------------------------------------------------
    def query(self, where: InstanceFilter, *, order: str = "created", descending: bool = True,
              limit: int | None = 50, offset: int = 0) -> builtins.list[InstanceRecord]:
        return self._full(self._run(
            lambda c: pg_read.query(c, where, order, descending, limit, offset)))

    def count(self, where: InstanceFilter, by: str | None = None) -> dict[str | None, int]:
        return self._run(lambda c: pg_read.count(c, where, by))

    def steps(self, where: InstanceFilter, *, batch: int = 5000) -> Iterator[StepRow]:
        return pg_read.steps(lambda sql, args: self._run(lambda c: c.execute(sql, args).fetchall()),
                             where, batch)

    def delete(self, instance_ids: Sequence[str], *,
               versions: Sequence[int] | None = None) -> int:
        return self._run(lambda c: pg_read.delete(c, instance_ids, versions), txn=True)

    def check(self) -> builtins.list[str]:
        return self._run(pg_read.check)



class _ClaimTxn:
    """``claims.claim``'s view of a PostgreSQL transaction: rows taken ``FOR UPDATE SKIP
    LOCKED``, limits serialised by transaction-scoped advisory locks."""

    def __init__(self, conn: psycopg.Connection[Any], request: ClaimRequest) -> None:
        self.conn, self.request = conn, request

    def rows(self, sql: str, args: Sequence[object]) -> builtins.list[Any]:
        return self.conn.execute(marks(sql), args).fetchall()

    def lock(self, name: str) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))

    def among(self, cond: str, args: Sequence[object], columns: str
              ) -> tuple[str, builtins.list[object]]:
        return f"SELECT {columns} FROM instances i WHERE i.{LIVE} AND {cond}", list(args)

    def take(self, cond: str, args: Sequence[object], limit: int) -> builtins.list[InstanceRecord]:
        # ``i.LIVE`` first: the term of the partial rank index (``schema.PG_RANK``), which the
        # planner walks in claim order under the LIMIT; without it (the arms of
        # ``claims.where`` imply it, but the planner does not see that) it sorted every
        # runnable row of a 10,000-instance backlog at each claim
        sql = marks(select(INSTANCE.columns) + f"i.{LIVE} AND " + cond
                    + ORDER + " LIMIT ? FOR UPDATE OF i SKIP LOCKED")
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sql, [*args, limit])
            rows = cur.fetchall()
        out, writes = [], []
        changed: builtins.list[tuple[tuple[str, ...], builtins.list[Any], Any]] = []
        req = self.request
        found = []
        for data in rows:
            prior = data.pop("prior_heartbeat")
            found.append((INSTANCE.decode(data), prior))
        for rec, prior in claims.takeable(req, found, self):  # ends the leases it takes from
            new, row = req.adopted(rec, prior)
            cols, values = scalar_changes(rec, new)  # a claim leaves the context alone
            changed.append((cols, values, rec.key))
            if row is not None:  # a takeover: its history row, in the claim's transaction
                encoded = HISTORY.values(row)
                encoded[0] = rec.key
                writes.append((_SQL_INSERT_HISTORY, encoded))
            new.version = rec.version + 1
            out.append(new)
        for cols, same, keys in claims.grouped(changed):  # one UPDATE per group
            writes.append((marks(claims.by_keys(cols, None)), [*same, keys]))
        if writes:
            with self.conn.pipeline(), self.conn.cursor() as cur:
                for stmt, params in writes:
                    cur.execute(stmt, params)
        return out
