"""SQLite store: one file, WAL journal, one transaction per batch of steps.

Schema creation and migrations go through ``sqlite-utils`` (imported only when one runs); the hot path
(``commit``) uses prepared statements on the same connection, updates only the
instance columns a step changed (``StepCommit.before``), and appends history
rows keyed by the instance's integer key, so steps of instances started
together share pages (see ``schema._v2``).  Every write is ``BEGIN IMMEDIATE``
… ``COMMIT`` so concurrent processes serialise on the write lock instead of
deadlocking; ``busy_timeout`` waits up to 30 s.
"""

from __future__ import annotations

import builtins
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .. import claims, leases, rates, sqlite_read
from ..claims import ORDER, ClaimRequest, select
from ..codec import (
    BREAKER as _BREAKER,
)
from ..codec import (
    CLAIM_REVIEW,
    PUT_REPLY,
    REPLY,
    REVIEW,
    SELECT_REPLY,
    SELECT_REVIEWS,
    reviews_where,
    scalar_changes,
)
from ..codec import (
    HISTORY as _HISTORY,
)
from ..codec import (
    INSERT_HISTORY as _INSERT_HISTORY,
)
from ..codec import (
    INSTANCE as _INSTANCE,
)
from ..codec import (
    SELECT_HISTORY as _SELECT_HISTORY,
)
from ..codec import (
    SELECT_INSTANCES as _SELECT_INSTANCES,
)
from ..codec import (
    WORKER as _WORKER,
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
from ..sql_base import SqlPlain
from .connect import _decode, _decode_worker, as_dict
from .steps import SqliteSteps
from .streams import SqliteStreams


class SqliteStore(SqliteSteps, SqliteStreams, SqlPlain):
    """The default store.

    Args:
        path: database file (created when missing); ``":memory:"`` for a private one.
        synchronous: ``"FULL"`` (default: a committed step survives power loss)
            or ``"NORMAL"`` (WAL: survives a process crash, not power loss).
        blob_threshold: history delta values longer than this many characters of
            JSON are stored once by content hash (default 64 KiB).
        readonly: open an existing database for reading only (the viewer): nothing
            is ever written, not even a migration; in WAL mode its reads never
            block a running engine's writes.  An older schema is refused with a
            hint to open it once with a writing command.

    Raises:
        NotAnFsmDatabase: the file is not SQLite, or is SQLite without fsm_engine's tables.
        StoreError: the file is corrupt, locked for too long or unwritable.
    """

    remote = False

    def history(self, instance_id: str) -> builtins.list[HistoryRow]:
        self.get(instance_id)
        rows = self._read(_SELECT_HISTORY, (instance_id,))
        return [self._expand(_decode(HistoryRow, r)) for r in rows]

    def attempts(self, instance_id: str) -> builtins.list[AttemptRow]:
        rows = self._read("SELECT * FROM attempts WHERE instance_id=? ORDER BY at, attempt",
                          (instance_id,))
        return [_decode(AttemptRow, r) for r in rows]

    # -- outbox ---------------------------------------------------------------
    def outbox_begin(self, key: str, instance_id: str, state: str, visit: int,
                     now: float) -> OutboxRow:
        return self.outbox_begins([OutboxBegin(key, instance_id, state, visit, now)])[0]

    def outbox_begins(self, begins: Sequence[OutboxBegin]) -> builtins.list[OutboxRow]:
        out = []
        with self._write() as conn:
            for key, instance_id, state, visit, now in begins:
                conn.execute(
                    "INSERT INTO outbox(key, instance_id, state, visit, status, attempts, "
                    "created_at, updated_at) VALUES (?,?,?,?, 'pending', 1, ?, ?) ON "
                    "CONFLICT(key) DO UPDATE SET attempts = attempts + 1, updated_at = "
                    "excluded.updated_at WHERE status = 'pending'",
                    (key, instance_id, state, visit, now, now))
                out.append(conn.execute("SELECT * FROM outbox WHERE key=?", (key,)).fetchone())
        return [_decode(OutboxRow, row) for row in out]

    def outbox(self, instance_id: str | None = None) -> builtins.list[OutboxRow]:
        sql, args = "SELECT * FROM outbox", ()  # type: tuple[str, tuple[str, ...]]
        if instance_id is not None:
            sql, args = sql + " WHERE instance_id=?", (instance_id,)
        return [_decode(OutboxRow, r) for r in self._read(sql + " ORDER BY rowid", args)]

    # -- reply cache ---------------------------------------------------------------
    def get_reply(self, key: str, not_before: float) -> ReplyRow | None:
        rows = self._read(SELECT_REPLY, (key, not_before))
        return REPLY.decode(as_dict(rows[0])) if rows else None

    def put_reply(self, row: ReplyRow) -> None:
        with self._write() as conn:
            conn.execute(PUT_REPLY, REPLY.values(row))

    # -- review queue ------------------------------------------------------------
    def reviews(self, *, statuses: Sequence[str] | None = None, machine: str | None = None,
                instance_id: str | None = None,
                id_prefix: str | None = None) -> builtins.list[ReviewItem]:
        sql, args = reviews_where(statuses, machine, instance_id, id_prefix)
        return [REVIEW.decode(as_dict(r)) for r in self._read(SELECT_REVIEWS + sql, args)]

    def claim_review(self, item_id: str, by: str, now: float) -> bool:
        with self._write() as conn:
            return conn.execute(CLAIM_REVIEW, (by, now, item_id, by)).rowcount == 1

    # -- leases ---------------------------------------------------------------
    def claim(self, request: ClaimRequest) -> builtins.list[InstanceRecord]:
        with self._write() as conn:  # BEGIN IMMEDIATE: claimers take turns, none shares a row
            out = claims.claim(request, _ClaimTxn(conn, request))
        return self._full(out)

    def held(self, owner: str) -> dict[str, str]:
        return dict(self._read("SELECT id, status FROM instances WHERE owner=?", (owner,)))

    def release(self, owner: str, ids: Sequence[str] | None = None, *, now: float) -> int:
        sql, args = ("UPDATE instances SET owner=NULL, version=version+1, updated_at=? "
                     "WHERE owner=?"), [now, owner]
        if ids is not None:
            if not ids:
                return 0
            sql += f" AND id IN ({', '.join('?' * len(ids))})"
            args.extend(ids)
        with self._write() as conn:
            return conn.execute(sql, args).rowcount

    def wait_for_work(self, timeout: float) -> None:
        """Polls ``PRAGMA data_version`` (it changes when another connection commits)
        every 50 ms; returns at the first change or after ``timeout``."""
        end = time.monotonic() + max(0.0, timeout)
        first = self._read("PRAGMA data_version")[0][0]
        while time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
            if self._read("PRAGMA data_version")[0][0] != first:
                return

    # -- workers --------------------------------------------------------------
    def put_worker(self, worker: WorkerRow) -> None:
        with self._write() as conn:
            conn.execute(_WORKER.insert_sql("workers", "INSERT OR REPLACE"), _WORKER.values(worker))

    def renew_worker(self, worker: WorkerRow, now: float) -> bool:
        with self._write() as conn:  # BEGIN IMMEDIATE: after or before a claim, never amid
            return conn.execute(leases.RENEW, leases.renewal(worker, now)).rowcount == 1

    def end_lease(self, worker_id: str, now: float, lease_seconds: float) -> bool:
        sql, args = leases.ending([worker_id], now, lease_seconds)
        with self._write() as conn:
            if conn.execute(sql, args).fetchall():
                return True
            return not conn.execute("SELECT 1 FROM workers WHERE id=?", (worker_id,)).fetchall()

    def fence(self, now: float, lease_seconds: float) -> int:
        return 0  # a session is this process's own file handle: nothing to end from here

    def workers(self) -> builtins.list[WorkerRow]:
        return [_decode_worker(r) for r in self._read("SELECT * FROM workers")]

    # -- circuit breakers -------------------------------------------------------
    def get_breaker(self, name: str) -> BreakerRow:
        rows = self._read("SELECT * FROM breakers WHERE name=?", (name,))
        return _decode(BreakerRow, rows[0]) if rows else BreakerRow(name)

    def put_breaker(self, row: BreakerRow, expected_version: int) -> bool:
        name, state, events, opened_at, probe_at, _ = _BREAKER.values(row)
        version = expected_version + 1
        with self._write() as conn:
            if expected_version == 0:
                cur = conn.execute(_BREAKER.insert_sql("breakers", "INSERT OR IGNORE"),
                                   (name, state, events, opened_at, probe_at, version))
            else:
                cur = conn.execute(
                    "UPDATE breakers SET state=?, events=?, opened_at=?, probe_at=?, version=?"
                    " WHERE name=? AND version=?",
                    (state, events, opened_at, probe_at, version, name, expected_version))
        ok = cur.rowcount == 1
        if ok:
            row.version = version
        return ok

    # -- rate limits ------------------------------------------------------------------
    def rate_acquire(self, request: RateRequest) -> tuple[float, str]:
        with self._write() as conn:  # BEGIN IMMEDIATE: one admission at a time
            return rates.acquire(request, lambda sql, args: conn.execute(sql, args).fetchall())

    # -- the shared SQL's primitives (``store.sql_base``) -------------------------------
    def _sql_rows(self, sql: str, args: Sequence[Any] = ()) -> builtins.list[Any]:
        return self._read(sql, args, tuples=True)

    def _sql_write(self, *statements: tuple[str, Sequence[Any]]) -> builtins.list[int]:
        with self._write() as conn:
            return [conn.execute(sql, args).rowcount for sql, args in statements]

    def _sql_write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._write() as conn:
            conn.executemany(sql, rows)

    # -- read side ------------------------------------------------------------------
    def query(self, where: InstanceFilter, *, order: str = "created", descending: bool = True,
              limit: int | None = 50, offset: int = 0) -> builtins.list[InstanceRecord]:
        sql, args = sqlite_read.query_sql(_SELECT_INSTANCES, where, order, descending,
                                          limit, offset)
        return self._full([_decode(InstanceRecord, r) for r in self._read(sql, args)])

    def count(self, where: InstanceFilter, by: str | None = None) -> dict[str | None, int]:
        sql, args = sqlite_read.count_sql(where, by)
        return {row[0]: row[1] for row in self._read(sql, args) if row[1]}

    def steps(self, where: InstanceFilter, *, batch: int = 5000) -> Iterator[StepRow]:
        sql, args = sqlite_read.steps_sql(where)
        after = 0
        while True:  # one short read per batch of instances: a writer never waits long
            rows = self._read(sql, [after, *args, batch], tuples=True)
            if not rows:
                return
            for row in rows:
                yield StepRow(*row[:-1])
            after = rows[-1][-1]

    def delete(self, instance_ids: Sequence[str], *,
               versions: Sequence[int] | None = None) -> int:
        ids = builtins.list(dict.fromkeys(instance_ids))
        deleted = 0
        with self._write() as conn:
            if versions is not None:  # (under the write lock: what is read stays so)
                ids = sqlite_read.ended_at(conn, instance_ids, versions)
            for i in range(0, len(ids), 500):  # bounded statements, one transaction
                chunk = ids[i:i + 500]
                marks = ",".join("?" * len(chunk))
                conn.execute("DELETE FROM history WHERE instance IN (SELECT key FROM instances"
                             f" WHERE id IN ({marks}))", chunk)
                conn.execute(f"DELETE FROM attempts WHERE instance_id IN ({marks})", chunk)
                conn.execute(f"DELETE FROM outbox WHERE instance_id IN ({marks})", chunk)
                conn.execute(f"DELETE FROM review_items WHERE instance_id IN ({marks})", chunk)
                conn.execute(f"DELETE FROM stream_rows WHERE instance_id IN ({marks})", chunk)
                deleted += conn.execute(f"DELETE FROM instances WHERE id IN ({marks})",
                                        chunk).rowcount
        return deleted

    def check(self) -> builtins.list[str]:
        problems = [f"integrity_check: {row[0]}" for row in
                    self._read("PRAGMA integrity_check") if row[0] != "ok"]
        for name, sql in sqlite_read.CHECKS:
            problems += [sqlite_read.describe(name, tuple(row)) for row in self._read(sql)]
        return problems



def claim_sql(cond: str, args: Sequence[object], limit: int) -> tuple[str, builtins.list[object]]:
    """The read of a claim's candidates (``claims.where``'s ``cond`` and ``args``): the keys
    of the first ``limit`` in claim order, read arm by arm through their indexes
    (``claims.by_arm``), then those rows whole with their owners' last heartbeats."""
    arms, arm_args = claims.by_arm(cond, args)
    return (select(_INSTANCE.columns) + f"i.key IN (SELECT key FROM ({arms}) ORDER BY rank, "
            "key LIMIT ?)" + ORDER, [*arm_args, limit])


class _ClaimTxn:
    """``claims.claim``'s view of a SQLite write transaction (its lock serialises every
    claimer already: ``lock`` has nothing to add)."""

    def __init__(self, conn: sqlite3.Connection, request: ClaimRequest) -> None:
        self.conn, self.request = conn, request

    def rows(self, sql: str, args: Sequence[object]) -> builtins.list[Any]:
        return self.conn.execute(sql, args).fetchall()

    def lock(self, name: str) -> None:
        return None

    def among(self, cond: str, args: Sequence[object], columns: str
              ) -> tuple[str, builtins.list[object]]:
        return claims.by_arm(cond, args, columns)

    def take(self, cond: str, args: Sequence[object], limit: int) -> builtins.list[InstanceRecord]:
        sql, arm_args = claim_sql(cond, args, limit)
        out: builtins.list[InstanceRecord] = []
        req = self.request
        found = []
        cursor = self.conn.cursor()
        cursor.row_factory = None  # plain tuples, read by position (``Codec.from_values``)
        for row in cursor.execute(sql, arm_args).fetchall():
            values = list(row)
            prior = values.pop()  # ``select``'s last column: the owner's last heartbeat
            found.append((_INSTANCE.from_values(values), prior))
        writes: builtins.list[tuple[tuple[str, ...], builtins.list[Any], Any]] = []
        for rec, prior in claims.takeable(req, found, self):  # ends the leases it takes from
            new, history = req.adopted(rec, prior)
            cols, values = scalar_changes(rec, new)  # a claim leaves the context alone
            writes.append((cols, values, rec.key))
            if history is not None:  # a takeover: its history row, in the claim's transaction
                encoded = _HISTORY.values(history)
                encoded[0] = rec.key
                self.conn.execute(_INSERT_HISTORY, encoded)
            new.version = rec.version + 1
            out.append(new)
        for cols, same, keys in claims.grouped(writes):  # one UPDATE per group
            for lo in range(0, len(keys), 500):
                chunk = keys[lo:lo + 500]
                self.conn.execute(claims.by_keys(cols, len(chunk)), [*same, *chunk])
        return out
