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
import hashlib
import json
import os
import threading
import time
from typing import Any, Callable, Iterator, Sequence, TypeVar

import psycopg
from psycopg.rows import dict_row

from ..errors import InstanceNotFound, NotAnFsmDatabase, StepRejected, StoreError
from ..redaction import redact
from . import claims, leases, pg_commit, rates
from . import definitions as definitions_sql
from . import limits as limits_sql
from .rates import RateRequest
from .claims import ClaimRequest, select, take
from .codec import (
    ATTEMPT, BREAKER, CONTEXT_THRESHOLD, DELTA, HISTORY, INSERT_HISTORY, INSTANCE,
    SELECT_HISTORY, SELECT_INSTANCES, WORKER, Blobs, Codec, Encoded, changes, dumps,
    encode_step, instance_row,
    child_outputs, marks, resolve, update_sql,
    CLAIM_REVIEW, CLOSE_REVIEW, INSERT_REVIEW, REVIEW, SELECT_REVIEWS, close_review_args,
    PUT_REPLY, REPLY, SELECT_REPLY,
    reviews_where,
)
from . import pg_read
from .pg_schema import migrate, require_current
from .records import (
    CHILD_OUTPUT_COLUMNS, CHILD_STATE_COLUMNS, FINAL_STATUSES, FORMAT_VERSION, AttemptRow,
    BreakerRow, ChildOutput, ChildState, DefinitionRow, HistoryRow,
    InstanceFilter, InstanceRecord,
    OutboxBegin, OutboxRow, ReplyRow, ReviewItem, StepCommit, StepRow, WorkerRow,
)

T = TypeVar("T")

#: History delta values whose JSON is longer than this are stored once in ``blobs``: the
#: context's threshold, so a large value a step wrote to the context (already in ``blobs``)
#: costs the history row a hash, not a second copy.  A history row over ~2 KB would
#: otherwise be compressed (pglz) and TOASTed by the server on every insert: measured by
#: ``bench/scale_out.py``, the collect step's 12–35 KB delta was most of the server's CPU
#: per history row.
BLOB_THRESHOLD = CONTEXT_THRESHOLD
#: The channel workers LISTEN on; created and released instances NOTIFY it.
CHANNEL = "fsm_work"
#: Most idle connections kept for reuse: after a burst the rest are closed, so a
#: quiet process holds a few server connections, not the burst's peak.
MAX_IDLE = 8

OUTBOX = Codec(OutboxRow)
_SQL_INSTANCE_BY_ID = marks(SELECT_INSTANCES + " WHERE id=?")
_SQL_HISTORY = marks(SELECT_HISTORY)
_SQL_INSERT_HISTORY = marks(INSERT_HISTORY)
_SQL_INSERT_ATTEMPT = marks(ATTEMPT.insert_sql("attempts"))
_KEY = INSTANCE.columns.index("key")
_NEW_COLUMNS = [c for c in INSTANCE.columns if c != "key"]  # ``key`` comes from the identity
_SQL_INSERT_INSTANCE = (f"INSERT INTO instances({', '.join(_NEW_COLUMNS)}) VALUES "
                        f"({', '.join(['%s'] * len(_NEW_COLUMNS))}) RETURNING key")
_SQL_WAKE = ("UPDATE instances SET status='running', updated_at=%s, version=version+1 "
             "WHERE id=%s AND status='waiting' AND reason='children'")
_SQL_OUTBOX_DONE = "UPDATE outbox SET status='done', result=%s, updated_at=%s WHERE key=%s"
_SQL_OUTBOX = f"SELECT {', '.join(OUTBOX.columns)} FROM outbox"
_SQL_OUTBOX_BEGIN = (
    "INSERT INTO outbox(key, instance_id, state, visit, status, attempts, created_at, "
    "updated_at) VALUES (%s,%s,%s,%s,'pending',1,%s,%s) ON CONFLICT (key) DO UPDATE SET "
    "attempts = outbox.attempts + 1, updated_at = excluded.updated_at "
    f"WHERE outbox.status = 'pending' RETURNING {', '.join(OUTBOX.columns)}")
_SQL_ATTEMPTS = (f"SELECT {', '.join(ATTEMPT.columns)} FROM attempts WHERE instance_id=%s "
                 "ORDER BY at, attempt, ord")
_SQL_WORKERS = f"SELECT {', '.join(WORKER.columns)} FROM workers"
_SQL_PUT_WORKER = (marks(WORKER.insert_sql("workers")) + " ON CONFLICT (id) DO UPDATE SET "
                   + ", ".join(f"{c}=excluded.{c}" for c in WORKER.columns[1:]))
_SQL_RENEW = marks(leases.RENEW)
_SQL_BREAKER = f"SELECT {', '.join(BREAKER.columns)} FROM breakers WHERE name=%s"


class _ClaimTxn:
    """``claims.claim``'s view of a PostgreSQL transaction: rows taken ``FOR UPDATE SKIP
    LOCKED``, limits serialised by transaction-scoped advisory locks."""

    def __init__(self, conn: psycopg.Connection[Any], request: ClaimRequest) -> None:
        self.conn, self.request = conn, request

    def rows(self, sql: str, args: Sequence[object]) -> builtins.list[Any]:
        return self.conn.execute(marks(sql), args).fetchall()

    def lock(self, name: str) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))

    def take(self, cond: str, args: Sequence[object], limit: int) -> builtins.list[InstanceRecord]:
        sql = marks(select(INSTANCE.columns) + cond
                    + " ORDER BY i.key LIMIT ? FOR UPDATE OF i SKIP LOCKED")
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sql, [*args, limit])
            rows = cur.fetchall()
        out, writes = [], []
        req = self.request
        found = []
        for data in rows:
            prior = data.pop("prior_heartbeat")
            found.append((INSTANCE.decode(data), prior))
        for rec, prior in claims.takeable(req, found, self):  # ends the leases it takes from
            new, row = take(rec, req, prior)
            cols, values = changes(rec, new, [])  # a claim leaves the context alone
            writes.append((marks(update_sql(cols, True)),
                           [*values, rec.key, rec.id, rec.version]))
            if row is not None:  # a takeover: its history row, in the claim's transaction
                encoded = HISTORY.values(row)
                encoded[0] = rec.key
                writes.append((_SQL_INSERT_HISTORY, encoded))
            new.version = rec.version + 1
            out.append(new)
        if writes:
            with self.conn.pipeline(), self.conn.cursor() as cur:
                for stmt, params in writes:
                    cur.execute(stmt, params)
        return out


class _Undo(StoreError):
    """Rolls back a savepoint (a decision whose item or instance moved on)."""


def _fast_compression(conn: psycopg.Connection[Any]) -> None:
    """Compress the large values this session writes with LZ4 instead of pglz (the
    default): a step's context row over ~2 KB is compressed by the server on every
    UPDATE, and pglz was the server's largest cost in ``bench/scale_out.py`` (perf: 14 %
    of its samples).  Values of either method read back alike; a server built without
    LZ4 keeps pglz."""
    try:
        conn.execute("SET default_toast_compression = 'lz4'")
    except psycopg.Error:
        pass


def _why(exc: BaseException) -> str:
    """A psycopg error as one short line, credentials redacted (libpq may quote the DSN)."""
    text = " ".join(redact(exc).split()) or type(exc).__name__
    return text[:300]


class PostgresStore:
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

    def __init__(self, url: str, *, create: bool = True, connect_timeout: float = 5.0,
                 blob_threshold: int = BLOB_THRESHOLD, readonly: bool = False) -> None:
        self._dsn = url
        self.readonly = readonly
        self.url = redact(url)
        try:
            self._session: dict[str, Any] = pg_read.read_only(url) if readonly else {}
        except psycopg.Error as exc:  # a malformed DSN
            raise StoreError(f"cannot open database {self.url}: {_why(exc)}") from None
        self.connect_timeout = connect_timeout
        self.blob_threshold = blob_threshold
        self._pool_lock = threading.Lock()
        self._idle: builtins.list[psycopg.Connection[Any]] = []
        self._generation = 0  # bumped by close(): connections of older ones are not kept
        self._listener: psycopg.Connection[Any] | None = None
        #: The heartbeat's own connection (``renew_worker``, ``held``): a lease is renewed
        #: even while the main connection is busy with a group commit.
        self._side: psycopg.Connection[Any] | None = None
        self._side_lock = threading.Lock()
        conn = self._connect()
        try:
            if readonly:
                require_current(conn, self.url)
            else:
                migrate(conn, self.url, create=create)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot open database {self.url}: {_why(exc)}") from None
        except (StoreError, NotAnFsmDatabase):
            conn.close()
            raise
        self._idle.append(conn)

    # -- connections -------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self._dsn, autocommit=True,
                                   connect_timeout=max(1, int(self.connect_timeout)),
                                   application_name=f"fsm_engine:{os.getpid()}",
                                   **self._session)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to {self.url}: {_why(exc)}") from None
        if not self.readonly:
            _fast_compression(conn)
        return conn

    def _take(self) -> tuple[psycopg.Connection[Any], int]:
        """An idle connection (a new one when none is idle) and the pool's generation."""
        with self._pool_lock:
            generation = self._generation
            while self._idle:
                conn = self._idle.pop()
                if not (conn.closed or conn.broken):
                    return conn, generation
                conn.close()
        return self._connect(), generation

    def _give(self, conn: psycopg.Connection[Any], generation: int) -> None:
        """Back to the pool; a broken connection is closed with every idle one (a server
        that dropped one has most likely dropped them all)."""
        if conn.closed or conn.broken:
            conn.close()
            with self._pool_lock:
                stale, self._idle = self._idle, []
            for other in stale:
                other.close()
            return
        with self._pool_lock:
            if generation == self._generation and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _run(self, fn: Callable[[psycopg.Connection[Any]], T], *, txn: bool = False) -> T:
        """``fn(conn)`` on a pooled connection (in one transaction when ``txn``); psycopg
        errors become one-line ``StoreError``s; a lost connection is replaced on the next
        call."""
        conn, generation = self._take()
        try:
            if not txn:
                return fn(conn)
            with conn.transaction():
                return fn(conn)
        except psycopg.Error as exc:
            raise StoreError(f"database {self.url}: {_why(exc)}") from None
        finally:
            self._give(conn, generation)

    def _on_side(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn`` on the heartbeat connection (reconnected when lost)."""
        with self._side_lock:
            if self._side is None or self._side.closed or self._side.broken:
                if self._side is not None:
                    self._side.close()
                self._side = None
                self._side = self._connect()
            try:
                return fn(self._side)
            except psycopg.Error as exc:
                raise StoreError(f"database {self.url}: {_why(exc)}") from None

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> builtins.list[dict[str, Any]]:
        def go(conn: psycopg.Connection[Any]) -> builtins.list[dict[str, Any]]:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(sql, args)
                return cur.fetchall()
        return self._run(go)

    # -- instances ------------------------------------------------------------------
    def create(self, *records: InstanceRecord, history: Sequence[HistoryRow] = ()) -> None:
        if not records:
            return
        rows, blobs = self._instance_rows(records)

        def go(conn: psycopg.Connection[Any]) -> builtins.list[int]:
            self._put_blobs(conn, blobs)
            keys = self._keys(conn, rows)
            with conn.cursor() as cur:
                by_id = {r.id: k for r, k in zip(records, keys)}
                copied = []
                for h in history:
                    row = HISTORY.values(h)
                    row[0] = by_id[h.instance_id]
                    copied.append(row)
                if copied:
                    cur.executemany(_SQL_INSERT_HISTORY, copied)
                cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            return keys
        for rec, key in zip(records, self._run(go, txn=True)):
            rec.key = key

    @staticmethod
    def _keys(conn: psycopg.Connection[Any], rows: builtins.list[builtins.list[Any]]
              ) -> builtins.list[int]:
        """Insert instance rows (without ``key``); their new keys, in order."""
        with conn.cursor() as cur:
            cur.executemany(_SQL_INSERT_INSTANCE, rows, returning=True)
            keys = []
            while True:
                keys.append(cur.fetchone()[0])  # type: ignore[index]
                if not cur.nextset():
                    break
        return keys

    @staticmethod
    def _instance_rows(records: Sequence[InstanceRecord]
                       ) -> tuple[builtins.list[builtins.list[Any]], Blobs]:
        """The INSERT rows of ``records`` (without ``key``: the database assigns it) and
        the large values they put beside themselves."""
        blobs: Blobs = []
        rows = []
        for rec in records:
            row = instance_row(rec, blobs)
            del row[_KEY]
            rows.append(row)
        return rows, blobs

    def _insert(self, conn: psycopg.Connection[Any], records: Sequence[InstanceRecord]) -> None:
        rows, blobs = self._instance_rows(records)
        self._put_blobs(conn, blobs)
        for rec, key in zip(records, self._keys(conn, rows)):
            rec.key = key

    def get(self, instance_id: str) -> InstanceRecord:
        rows = self._rows(_SQL_INSTANCE_BY_ID, (instance_id,))
        if not rows:
            raise InstanceNotFound(instance_id)
        return self._full([INSTANCE.decode(rows[0])])[0]

    def _full(self, records: builtins.list[InstanceRecord]) -> builtins.list[InstanceRecord]:
        """``records`` with their large context values read back from ``blobs``."""
        return resolve(records, self._fetch_blobs)

    def _fetch_blobs(self, hashes: builtins.list[str]) -> dict[str, str]:
        """hash → JSON text of the ``blobs`` rows of ``hashes``."""
        rows = self._rows("SELECT hash, data FROM blobs WHERE hash = ANY(%s)", (hashes,))
        return {r["hash"]: r["data"] for r in rows}

    @staticmethod
    def _put_blobs(conn: psycopg.Connection[Any], blobs: Blobs) -> None:
        if blobs:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO blobs(hash, data) VALUES (%s, %s) "
                                "ON CONFLICT DO NOTHING", blobs)

    def list(self, *, statuses: Sequence[str] | None = None,
             machine: str | None = None, owner: str | None = None) -> builtins.list[InstanceRecord]:
        sql, args = SELECT_INSTANCES + " WHERE TRUE", []  # type: tuple[str, builtins.list[Any]]
        if owner:
            sql += " AND owner=%s"
            args.append(owner)
        if statuses:
            sql += " AND status = ANY(%s)"
            args.append(builtins.list(statuses))
        if machine:
            sql += " AND machine=%s"
            args.append(machine)
        return self._full([INSTANCE.decode(r) for r in self._rows(sql + " ORDER BY key", args)])

    # -- the hot path -------------------------------------------------------------------
    def commit(self, steps: Sequence[StepCommit]) -> builtins.list[bool]:
        if not steps:
            return []
        encoded = [encode_step(i, step) for i, step in enumerate(steps)]  # refusals first
        if pg_commit.plain(steps):
            applied = self._commit_plain(steps, encoded)
            if applied is not None:
                return applied

        def go(conn: psycopg.Connection[Any]) -> builtins.list[bool]:
            plain = [i for i, s in enumerate(steps)
                     if s.review_close is None and not s.compound]
            applied = [False] * len(steps)
            if plain:
                for i, ok in zip(plain, self._updates(conn, [steps[i] for i in plain],
                                                      [encoded[i] for i in plain])):
                    applied[i] = ok
            done = [i for i in plain if applied[i]]
            wakes = [(steps[i].record.updated_at, steps[i].wake) for i in done if steps[i].wake]
            if wakes:  # children that ended tell their parents, in the same transaction
                with conn.cursor() as cur:
                    cur.executemany(_SQL_WAKE, wakes)
                    cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            try:
                with conn.transaction():  # a savepoint: a constraint is one step's fault
                    self._appends(conn, [(steps[i], encoded[i]) for i in done])
            except psycopg.IntegrityError as exc:
                raise self._rejected(conn, steps, encoded, done, exc) from None
            for i, step in enumerate(steps):  # decisions: each alone, under a savepoint
                if step.review_close is not None:
                    applied[i] = self._decide(conn, step, encoded[i])
            for i, st in enumerate(steps):  # families: each alone, under a savepoint
                if st.compound and st.review_close is None:
                    applied[i] = self._compound(conn, st, encoded[i])
            if any(ok and s.record.owner is None and s.record.status == "running"
                   for s, ok in zip(steps, applied)):  # given back (a queue hand-off)
                conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            return applied
        keys = [(s.record, s.record.key) for s in steps]
        try:
            applied = self._run(go, txn=True)
        except BaseException:
            for rec, key in keys:
                rec.key = key
            raise
        for step, ok in zip(steps, applied):
            if ok:
                for s in [step, *step.also]:
                    s.record.version = s.expected_version + 1
        return applied

    def _commit_plain(self, steps: Sequence[StepCommit], encoded: Sequence[Encoded]
                      ) -> builtins.list[bool] | None:
        """``commit`` of a batch that fits one statement (``pg_commit``); ``None`` when the
        statement broke a constraint (nothing applied: the general path finds the step)."""
        batch = pg_commit.Batch()
        for i, (step, enc) in enumerate(zip(steps, encoded)):
            batch.add(i, step, enc, self.blob_threshold, self._shrink)

        def go(conn: psycopg.Connection[Any]) -> builtins.list[Any] | None:
            try:
                with psycopg.RawCursor(conn) as cur:
                    return cur.execute(pg_commit.statement(), batch.params()).fetchall()
            except psycopg.IntegrityError:
                return None
        rows = self._run(go)
        if rows is None:
            return None
        applied = [False] * len(steps)
        for (i,) in rows:
            applied[i] = True
            steps[i].record.version = steps[i].expected_version + 1
        return applied

    def _rejected(self, conn: psycopg.Connection[Any], steps: Sequence[StepCommit],
                  encoded: Sequence[Encoded], done: Sequence[int],
                  exc: psycopg.Error) -> StepRejected:
        """The ``StepRejected`` naming the first applied step whose rows break a constraint
        (each tried alone in a savepoint; the caller's transaction then rolls back)."""
        for i in done:
            try:
                with conn.transaction():
                    self._appends(conn, [(steps[i], encoded[i])])
            except psycopg.IntegrityError:
                break
        else:
            i = done[0]
        return StepRejected(f"the store refused a step of instance {steps[i].record.id}: "
                            f"{_why(exc)}", index=i, instance_id=steps[i].record.id)

    def _compound(self, conn: psycopg.Connection[Any], step: StepCommit,
                  enc: Encoded) -> bool:
        """A step with what it carries, in a savepoint: all of it applies, or none.  Fenced
        rows are locked (``FOR UPDATE``) so none moves on before this transaction ends."""
        class _Stale(Exception):
            pass
        created = [(r, r.key) for r in step.create]
        try:
            with conn.transaction():
                with conn.cursor() as cur:
                    for instance_id, version in step.fence:
                        cur.execute("SELECT version FROM instances WHERE id=%s FOR UPDATE",
                                    (instance_id,))
                        row = cur.fetchone()
                        if row is None or row[0] != version:
                            raise _Stale
                group = [(step, enc), *((s, encode_step(0, s)) for s in step.also)]
                if not all(self._updates(conn, [g[0] for g in group], [g[1] for g in group])):
                    raise _Stale
                self._appends(conn, group)
                if step.create:
                    self._insert(conn, step.create)
                with conn.cursor() as cur:
                    if step.wake:
                        cur.execute(_SQL_WAKE, (step.record.updated_at, step.wake))
                    if step.create or step.wake:
                        cur.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
        except (_Stale, psycopg.errors.UniqueViolation):
            for rec, key in created:
                rec.key = key
            return False
        return True

    def children(self, parent_id: str) -> builtins.list[InstanceRecord]:
        rows = self._rows(marks(SELECT_INSTANCES + " WHERE parent_id=? ORDER BY key"),
                          (parent_id,))
        return self._full([INSTANCE.decode(r) for r in rows])

    def child_states(self, parent_id: str) -> builtins.list[ChildState]:
        def go(conn: psycopg.Connection[Any]) -> builtins.list[ChildState]:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {CHILD_STATE_COLUMNS} FROM instances WHERE parent_id=%s "
                            "ORDER BY key", (parent_id,))
                return [ChildState(*r) for r in cur.fetchall()]
        return self._run(go)

    def child_outputs(self, parent_id: str) -> builtins.list[ChildOutput]:
        def go(conn: psycopg.Connection[Any]) -> builtins.list[Any]:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {CHILD_OUTPUT_COLUMNS} FROM instances WHERE parent_id=%s "
                            "AND status = ANY(%s) ORDER BY key",
                            (parent_id, sorted(FINAL_STATUSES)))
                return cur.fetchall()
        return child_outputs(self._run(go), self._fetch_blobs)

    def _updates(self, conn: psycopg.Connection[Any], steps: Sequence[StepCommit],
                 encoded: Sequence[Encoded]) -> builtins.list[bool]:
        """Every step's compare-and-set UPDATE, in order, in one pipeline; True where applied
        (a later step of the same instance sees the earlier one's version)."""
        cursors = []
        with conn.pipeline():
            for step, (cols, values, *_) in zip(steps, encoded):
                rec = step.record
                by_key = rec.key is not None
                args = [*values, *((rec.key, rec.id) if by_key else (rec.id,)),
                        step.expected_version]
                cur = conn.cursor()
                cur.execute(marks(update_sql(cols, by_key)), args)
                cursors.append((cur, by_key))
        applied = []
        for step, (cur, by_key) in zip(steps, cursors):
            if by_key:
                applied.append(cur.rowcount == 1)
            else:
                found = cur.fetchall()
                if found:
                    step.record.key = found[0][0]
                applied.append(bool(found))
            cur.close()
        return applied

    def _decide(self, conn: psycopg.Connection[Any], step: StepCommit, enc: Encoded) -> bool:
        """Close the step's review item and apply the step, both or neither."""
        assert step.review_close is not None
        try:
            with conn.transaction():
                cur = conn.execute(marks(CLOSE_REVIEW), close_review_args(step.review_close))
                if cur.rowcount != 1 or not self._updates(conn, [step], [enc])[0]:
                    raise _Undo("decision not applied")
                self._appends(conn, [(step, enc)])
                if step.wake:  # a decision that ends a child wakes its parent
                    conn.execute(_SQL_WAKE, (step.record.updated_at, step.wake))
                    conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
        except _Undo:
            return False
        return True

    def _appends(self, conn: psycopg.Connection[Any],
                 steps: Sequence[tuple[StepCommit, Encoded]]) -> None:
        """History, attempt and outbox rows of the applied ``steps`` (batched)."""
        history: list[list[Any]] = []
        attempts: list[Any] = []
        done: list[Any] = []
        opened: list[Any] = []
        blobs: Blobs = []
        for step, (_, _, rows, attempt, outbox, large) in steps:
            blobs += large
            for h, encoded_row in zip(step.history, rows):
                row = list(encoded_row)
                row[0] = step.record.key
                if len(row[DELTA]) > self.blob_threshold:
                    row[DELTA] = self._shrink(h.delta, large, blobs)
                history.append(row)
            if attempt is not None:
                attempts.append(attempt)
            if outbox is not None:
                done.append(outbox)
            if step.review_open is not None:
                opened.append(REVIEW.values(step.review_open))
        self._put_blobs(conn, blobs)
        with conn.cursor() as cur:
            for sql, rows in ((_SQL_INSERT_HISTORY, history), (_SQL_INSERT_ATTEMPT, attempts),
                              (_SQL_OUTBOX_DONE, done), (marks(INSERT_REVIEW), opened)):
                if rows:
                    cur.executemany(sql, rows)

    def _shrink(self, delta: dict[str, Any], known: Blobs, blobs: Blobs) -> str:
        """``delta``'s JSON with each value longer than ``blob_threshold`` replaced by
        ``{"$blob": hash}``; the value goes to ``blobs`` unless ``known`` (the step's
        large context values, stored anyway) already holds it."""
        out: dict[str, Any] = {}
        for key, value in delta.items():
            text = dumps(value)
            if len(text) > self.blob_threshold:
                digest = next((d for d, data in known if data == text), None)
                if digest is None:
                    digest = hashlib.sha256(text.encode()).hexdigest()
                    blobs.append((digest, text))
                value = {"$blob": digest}
            out[key] = value
        return dumps(out)

    def _expand(self, row: HistoryRow) -> HistoryRow:
        for key, value in row.delta.items():
            if isinstance(value, dict) and len(value) == 1 and "$blob" in value:
                data = self._rows("SELECT data FROM blobs WHERE hash=%s", (value["$blob"],))
                row.delta[key] = json.loads(data[0]["data"]) if data else None
        return row

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

    def release(self, owner: str, ids: Sequence[str] | None = None) -> int:
        if ids is not None and not ids:
            return 0
        sql = "UPDATE instances SET owner=NULL, version=version+1, updated_at=%s WHERE owner=%s"
        args: builtins.list[Any] = [time.time(), owner]
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

    def workers(self) -> builtins.list[WorkerRow]:
        out = []
        for row in self._rows(_SQL_WORKERS):
            worker = WORKER.decode(row)
            worker.queues = worker.queues or []
            out.append(worker)
        return out

    def delete_worker(self, worker_id: str) -> None:
        self._run(lambda conn: conn.execute("DELETE FROM workers WHERE id=%s", (worker_id,)))

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

    def rate_settle(self, name: str, key: str, tokens: int, until: float) -> None:
        self._run(lambda conn: conn.execute(marks(rates.SETTLE), (tokens, until, name, key)))

    def get_limits(self) -> dict[str, Any] | None:
        return limits_sql.decode(self._run(
            lambda conn: conn.execute(limits_sql.GET).fetchall()))

    def put_limits(self, limits: dict[str, Any] | None) -> None:
        def go(conn: psycopg.Connection[Any]) -> None:
            conn.execute(limits_sql.DROP)
            if limits:
                conn.execute(marks(limits_sql.PUT), (limits_sql.encode(limits),))
        self._run(go, txn=True)

    # -- definitions --------------------------------------------------------------------
    def put_definitions(self, rows: Sequence[DefinitionRow]) -> None:
        if rows:
            self._run(lambda conn: conn.cursor().executemany(
                marks(definitions_sql.PUT), definitions_sql.encode_all(rows)), txn=True)

    def get_definition(self, machine: str, version: int,
                       fingerprint: str) -> DefinitionRow | None:
        return definitions_sql.decode(self._run(lambda conn: conn.execute(
            marks(definitions_sql.GET), (machine, version, fingerprint)).fetchall()))

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

    def delete(self, instance_ids: Sequence[str]) -> int:
        return self._run(lambda c: pg_read.delete(c, instance_ids), txn=True)

    def check(self) -> builtins.list[str]:
        return self._run(pg_read.check)

    def close(self) -> None:
        with self._pool_lock, self._side_lock:
            self._generation += 1
            for conn in (*self._idle, self._listener, self._side):
                if conn is not None:
                    conn.close()
            self._idle, self._listener, self._side = [], None, None

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r}, format={FORMAT_VERSION})"

