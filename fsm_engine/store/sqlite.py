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

import hashlib
import json
import os
import sqlite3
import threading
import time
import urllib.parse
from typing import Any, Iterator, Sequence

from ..errors import InstanceNotFound, NotAnFsmDatabase, StoreError
from . import sqlite_read
from .records import (
    CHILD_OUTPUT_COLUMNS, CHILD_STATE_COLUMNS, FINAL_STATUSES, FORMAT_VERSION, AttemptRow,
    BreakerRow, ChildOutput, ChildState, DefinitionRow, HistoryRow,
    InstanceFilter, InstanceRecord,
    OutboxBegin, OutboxRow, ReplyRow, ReviewItem, StepCommit, StepRow, WorkerRow,
)
from .codec import (
    ATTEMPT as _ATTEMPT, BREAKER as _BREAKER, DELTA as _DELTA, HISTORY as _HISTORY,
    INSERT_HISTORY as _INSERT_HISTORY, INSTANCE as _INSTANCE, JSON_COLUMNS,
    SELECT_HISTORY as _SELECT_HISTORY, SELECT_INSTANCES as _SELECT_INSTANCES, WORKER as _WORKER,
    Blobs, Encoded, changes as _changes, dumps as _dumps, encode_step as _encode,
    instance_row as _instance_row, resolve as _resolve, child_outputs as _child_outputs,
    update_sql as _update_sql,
    CLAIM_REVIEW, CLOSE_REVIEW, INSERT_REVIEW, REVIEW, SELECT_REVIEWS, close_review_args,
    PUT_REPLY, REPLY, SELECT_REPLY,
    reviews_where,
)
from . import claims, leases, rates
from . import definitions as definitions_sql
from . import limits as limits_sql
from .sqlite_batch import REFUSED, Rows, insert_history, rejected
from .rates import RateRequest
from .claims import ClaimRequest, select, take
from .schema import migrate, read_version, refuse_foreign

_HEADER = b"SQLite format 3\x00"

#: The final statuses as an SQL list (``child_outputs``).
_FINAL = ", ".join(f"'{s}'" for s in sorted(FINAL_STATUSES))

#: ``StepCommit.wake``: a parent waiting for its children becomes claimable.
_WAKE = ("UPDATE instances SET status='running', updated_at=?, version=version+1 "
         "WHERE id=? AND status='waiting' AND reason='children'")

#: History delta values whose JSON is longer than this (characters) are stored
#: once in ``blobs`` by SHA-256 and referenced as ``{"$blob": hash}``.
BLOB_THRESHOLD = 64 * 1024


def _decode(cls: type, row: sqlite3.Row) -> Any:
    data = dict(row)
    for col in JSON_COLUMNS & data.keys():
        if data[col] is not None:
            data[col] = json.loads(data[col])
    return cls(**data)


def _decode_worker(row: sqlite3.Row) -> WorkerRow:
    worker = _decode(WorkerRow, row)
    if worker.queues is None:  # a row written before format 3
        worker.queues = []
    return worker


def _check_file(path: str) -> None:
    if path == ":memory:" or not os.path.exists(path) or os.path.getsize(path) == 0:
        return
    try:
        with open(path, "rb") as fh:
            header = fh.read(16)
    except OSError as exc:
        raise StoreError(f"cannot open database {path}: {exc.strerror or exc}") from None
    if header != _HEADER:
        raise NotAnFsmDatabase(f"{path} is not an fsm database (not a SQLite file)")


def _create_private(path: str) -> None:
    """Create a new database file readable by its owner only (0600, whatever the umask):
    SQLite gives the ``-wal`` and ``-shm`` files it makes beside it the same mode.  An
    existing file keeps its mode."""
    if path == ":memory:" or os.path.exists(path):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise StoreError(f"cannot create database {path}: {exc.strerror or exc}") from None


class SqliteStore:
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

    def __init__(self, path: str = "fsm.db", *, synchronous: str = "FULL",
                 blob_threshold: int = BLOB_THRESHOLD, readonly: bool = False) -> None:
        self.path = path
        self.url = "sqlite://" + (path if path == ":memory:" else "/" + os.path.abspath(path))
        self.blob_threshold = blob_threshold
        self.readonly = readonly
        _check_file(path)
        self._lock = threading.RLock()
        folder = os.path.dirname(os.path.abspath(path))
        if path != ":memory:" and not os.path.isdir(folder):
            raise StoreError(f"cannot open database {path}: no directory {folder}")
        if readonly and not os.path.isfile(path):
            raise StoreError(f"no database at {path}")
        if not readonly:
            _create_private(path)
        try:
            target = (f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
                      if readonly else path)
            self._conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False,
                                         timeout=30.0, uri=readonly)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open database {path}: {exc}") from None
        try:
            self._conn.row_factory = sqlite3.Row
            refuse_foreign(self._conn, path)  # before anything that could write to the file
            if readonly:
                self._require_current()
            else:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute(f"PRAGMA synchronous={synchronous}")
                migrate(self._conn, path)
        except NotAnFsmDatabase:
            self._conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StoreError(f"cannot open database {path}: {exc}") from None
        self._attempt_sql = _ATTEMPT.insert_sql("attempts")
        self._insert_instance_sql = _INSTANCE.insert_sql("instances")

    def _require_current(self) -> None:
        version = read_version(self._conn, self.path)
        if version != FORMAT_VERSION:
            raise StoreError(f"{self.path} has schema version {version}, this fsm_engine "
                             f"reads {FORMAT_VERSION} read-only: open it once with a writing "
                             "command (e.g. `fsm resume`) to migrate it")

    # -- transactions -------------------------------------------------------
    def _write(self) -> "_Txn":
        if self.readonly:
            raise StoreError(f"database {self.path} is open read-only")
        return _Txn(self)

    def _read(self, sql: str, args: Sequence[Any] | dict[str, Any] = (), *,
              tuples: bool = False) -> builtins.list[Any]:
        """All rows of one read (its own implicit transaction); plain tuples with ``tuples``."""
        with self._lock:
            try:
                cursor = self._conn.cursor()
                if tuples:
                    cursor.row_factory = None
                return cursor.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"database {self.path}: {exc}") from None

    # -- instances ----------------------------------------------------------
    def create(self, *records: InstanceRecord, history: Sequence[HistoryRow] = ()) -> None:
        with self._write() as conn:  # the write lock is held: nobody else can take a key
            keys = [r.key for r in records]
            try:
                self._insert(conn, records)
            except BaseException:
                for rec, key in zip(records, keys):  # nothing was stored: no key either
                    rec.key = key
                raise
            by_id = {r.id: r.key for r in records}
            for h in history:
                row = _HISTORY.values(h)
                row[0] = by_id[h.instance_id]
                conn.execute(_INSERT_HISTORY, row)

    def get(self, instance_id: str) -> InstanceRecord:
        rows = self._read(_SELECT_INSTANCES + " WHERE id=?", (instance_id,))
        if not rows:
            raise InstanceNotFound(instance_id)
        return self._full([_decode(InstanceRecord, rows[0])])[0]

    def _full(self, records: builtins.list[InstanceRecord]) -> builtins.list[InstanceRecord]:
        """``records`` with their large context values read back from ``blobs``."""
        return _resolve(records, self._fetch_blobs)

    def _fetch_blobs(self, hashes: builtins.list[str]) -> dict[str, str]:
        """hash → JSON text of the ``blobs`` rows of ``hashes``."""
        return dict(self._read(f"SELECT hash, data FROM blobs WHERE hash IN "
                               f"({','.join('?' * len(hashes))})", hashes, tuples=True))

    @staticmethod
    def _put_blobs(conn: sqlite3.Connection, blobs: Blobs) -> None:
        if blobs:
            conn.executemany("INSERT OR IGNORE INTO blobs(hash, data) VALUES (?, ?)", blobs)

    def list(self, *, statuses: Sequence[str] | None = None,
             machine: str | None = None, owner: str | None = None) -> builtins.list[InstanceRecord]:
        sql, args = _SELECT_INSTANCES + " WHERE 1=1", []
        if owner:
            sql += " AND owner=?"
            args.append(owner)
        if statuses:
            sql += f" AND status IN ({','.join('?' * len(statuses))})"
            args.extend(statuses)
        if machine:
            sql += " AND machine=?"
            args.append(machine)
        return self._full([_decode(InstanceRecord, r)
                           for r in self._read(sql + " ORDER BY key", args)])

    def commit(self, steps: Sequence[StepCommit]) -> builtins.list[bool]:
        applied: builtins.list[bool] = []
        # history rows of the plain steps, inserted by one executemany at the end (~2 µs a
        # row less than one execute each); (step index, row) so a refusal names its step
        rows: Rows = []
        with self._write() as conn:
            for i, step in enumerate(steps):
                # encoded as it is written (a refusal rolls the whole batch back), so its
                # values are garbage at once rather than piling up for the collector
                enc = _encode(i, step)
                try:
                    if step.compound:
                        applied.append(self._compound(conn, step, enc))
                    else:
                        defer = rows if step.review_close is None else None
                        applied.append(self._apply(conn, step, enc, defer, i)
                                       and self._wake(conn, step))
                except REFUSED as exc:  # the step's, not the disk's
                    raise rejected(step, i, exc) from None
            if rows:
                insert_history(conn, rows, steps)
        return applied

    def _compound(self, conn: sqlite3.Connection, step: StepCommit, enc: Encoded) -> bool:
        """A step with what it carries, in a savepoint: all of it applies, or none."""
        conn.execute("SAVEPOINT step")
        saved = [(s.record, s.record.version, s.record.key) for s in [step, *step.also]]
        saved += [(r, r.version, r.key) for r in step.create]
        try:
            ok = self._fenced(conn, step.fence) and self._apply(conn, step, enc) and all(
                self._apply(conn, s, _encode(0, s)) for s in step.also)
            if ok and step.create:
                self._insert(conn, step.create)
            if ok:
                self._wake(conn, step)
        except sqlite3.IntegrityError:
            ok = False
        if ok:
            conn.execute("RELEASE step")
            return True
        conn.execute("ROLLBACK TO step")
        conn.execute("RELEASE step")
        for rec, version, key in saved:  # nothing was written: the records say so too
            rec.version, rec.key = version, key
        return False

    @staticmethod
    def _wake(conn: sqlite3.Connection, step: StepCommit) -> bool:
        if step.wake:
            conn.execute(_WAKE, (step.record.updated_at, step.wake))
        return True

    @staticmethod
    def _fenced(conn: sqlite3.Connection, fence: Sequence[tuple[str, int]]) -> bool:
        want = dict(fence)
        ids = builtins.list(want)
        for i in range(0, len(ids), 500):  # one query per 500 instances read
            chunk = ids[i:i + 500]
            rows = conn.execute(f"SELECT id, version FROM instances WHERE id IN "
                                f"({','.join('?' * len(chunk))})", chunk).fetchall()
            if len(rows) != len(chunk) or any(want[r[0]] != r[1] for r in rows):
                return False
        return True

    def _insert(self, conn: sqlite3.Connection, records: Sequence[InstanceRecord]) -> None:
        last = conn.execute("SELECT COALESCE(MAX(key), 0) FROM instances").fetchone()[0]
        for i, rec in enumerate(records, start=last + 1):
            rec.key = i
        blobs: Blobs = []
        rows = [_instance_row(rec, blobs) for rec in records]
        self._put_blobs(conn, blobs)
        conn.executemany(self._insert_instance_sql, rows)

    def children(self, parent_id: str) -> builtins.list[InstanceRecord]:
        rows = self._read(_SELECT_INSTANCES + " WHERE parent_id=? ORDER BY key", (parent_id,))
        return self._full([_decode(InstanceRecord, r) for r in rows])

    def child_states(self, parent_id: str) -> builtins.list[ChildState]:
        rows = self._read(f"SELECT {CHILD_STATE_COLUMNS} FROM instances WHERE parent_id=? "
                          "ORDER BY key", (parent_id,), tuples=True)
        return [ChildState(*r) for r in rows]

    def child_outputs(self, parent_id: str) -> builtins.list[ChildOutput]:
        rows = self._read(f"SELECT {CHILD_OUTPUT_COLUMNS} FROM instances WHERE parent_id=? "
                          f"AND status IN ({_FINAL}) ORDER BY key", (parent_id,), tuples=True)
        return _child_outputs(rows, self._fetch_blobs)

    def _apply(self, conn: sqlite3.Connection, step: StepCommit, enc: Encoded,
               defer: Rows | None = None, index: int = 0) -> bool:
        """Write one step in the open transaction; False (nothing written) when stale
        (or when the review item it decides is no longer open to its claimer).  With
        ``defer`` its history rows are appended there (as ``(index, row)``) for the
        caller to insert, else inserted here."""
        if step.review_close is None:
            return self._apply_step(conn, step, enc, defer, index)
        conn.execute("SAVEPOINT review_close")
        try:
            ok = (conn.execute(CLOSE_REVIEW, close_review_args(step.review_close)).rowcount == 1
                  and self._apply_step(conn, step, enc))
            if not ok:
                conn.execute("ROLLBACK TO review_close")
        finally:
            conn.execute("RELEASE review_close")
        return ok

    def _apply_step(self, conn: sqlite3.Connection, step: StepCommit, enc: Encoded,
                    defer: Rows | None = None,
                    index: int = 0) -> bool:
        cols, values, history, attempt, outbox, blobs = enc
        key = step.record.key
        if key is not None:
            values += (key, step.record.id, step.expected_version)
            if conn.execute(_update_sql(cols, True), values).rowcount != 1:
                return False
        else:
            values += (step.record.id, step.expected_version)
            found = conn.execute(_update_sql(cols, False), values).fetchall()  # (drained)
            if not found:
                return False
            key = step.record.key = found[0][0]
        step.record.version = step.expected_version + 1
        self._put_blobs(conn, blobs)
        for h, row in zip(step.history, history):
            row[0] = key  # the instance's key in place of its id
            if len(row[_DELTA]) > self.blob_threshold:
                row[_DELTA] = self._shrink(conn, h.delta)
            if defer is None:
                conn.execute(_INSERT_HISTORY, row)
            else:
                defer.append((index, row))
        if attempt is not None:
            conn.execute(self._attempt_sql, attempt)
        if outbox is not None:
            conn.execute("UPDATE outbox SET status='done', result=?, updated_at=? WHERE key=?",
                         outbox)
        if step.review_open is not None:
            conn.execute(INSERT_REVIEW, REVIEW.values(step.review_open))
        return True

    def _shrink(self, conn: sqlite3.Connection, delta: dict[str, Any]) -> str:
        """Move large delta values into ``blobs`` (once per content); return the delta's JSON."""
        out: dict[str, Any] = {}
        for key, value in delta.items():
            text = _dumps(value)
            if len(text) > self.blob_threshold:
                digest = hashlib.sha256(text.encode()).hexdigest()
                conn.execute("INSERT OR IGNORE INTO blobs(hash, data) VALUES (?, ?)", (digest, text))
                value = {"$blob": digest}
            out[key] = value
        return _dumps(out)

    def _expand(self, row: HistoryRow) -> HistoryRow:
        for key, value in row.delta.items():
            if isinstance(value, dict) and len(value) == 1 and "$blob" in value:
                data = self._read("SELECT data FROM blobs WHERE hash=?", (value["$blob"],))
                row.delta[key] = json.loads(data[0][0]) if data else None
        return row

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
        return REPLY.decode(dict(rows[0])) if rows else None

    def put_reply(self, row: ReplyRow) -> None:
        with self._write() as conn:
            conn.execute(PUT_REPLY, REPLY.values(row))

    # -- review queue ------------------------------------------------------------
    def reviews(self, *, statuses: Sequence[str] | None = None, machine: str | None = None,
                instance_id: str | None = None,
                id_prefix: str | None = None) -> builtins.list[ReviewItem]:
        sql, args = reviews_where(statuses, machine, instance_id, id_prefix)
        return [REVIEW.decode(dict(r)) for r in self._read(SELECT_REVIEWS + sql, args)]

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

    def release(self, owner: str, ids: Sequence[str] | None = None) -> int:
        sql, args = ("UPDATE instances SET owner=NULL, version=version+1, updated_at=? "
                     "WHERE owner=?"), [time.time(), owner]
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

    def workers(self) -> builtins.list[WorkerRow]:
        return [_decode_worker(r) for r in self._read("SELECT * FROM workers")]

    def delete_worker(self, worker_id: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM workers WHERE id=?", (worker_id,))

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

    def rate_settle(self, name: str, key: str, tokens: int, until: float) -> None:
        with self._write() as conn:
            conn.execute(rates.SETTLE, (tokens, until, name, key))

    def get_limits(self) -> dict[str, Any] | None:
        return limits_sql.decode(self._read(limits_sql.GET, tuples=True))

    def put_limits(self, limits: dict[str, Any] | None) -> None:
        with self._write() as conn:
            conn.execute(limits_sql.DROP)
            if limits:
                conn.execute(limits_sql.PUT, (limits_sql.encode(limits),))

    # -- definitions ------------------------------------------------------------------
    def put_definitions(self, rows: Sequence[DefinitionRow]) -> None:
        if rows:
            with self._write() as conn:
                conn.executemany(definitions_sql.PUT, definitions_sql.encode_all(rows))

    def get_definition(self, machine: str, version: int,
                       fingerprint: str) -> DefinitionRow | None:
        return definitions_sql.decode(self._read(definitions_sql.GET,
                                                 (machine, version, fingerprint), tuples=True))

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

    def delete(self, instance_ids: Sequence[str]) -> int:
        ids = builtins.list(dict.fromkeys(instance_ids))
        deleted = 0
        with self._write() as conn:
            for i in range(0, len(ids), 500):  # bounded statements, one transaction
                chunk = ids[i:i + 500]
                marks = ",".join("?" * len(chunk))
                conn.execute("DELETE FROM history WHERE instance IN (SELECT key FROM instances"
                             f" WHERE id IN ({marks}))", chunk)
                conn.execute(f"DELETE FROM attempts WHERE instance_id IN ({marks})", chunk)
                conn.execute(f"DELETE FROM outbox WHERE instance_id IN ({marks})", chunk)
                conn.execute(f"DELETE FROM review_items WHERE instance_id IN ({marks})", chunk)
                deleted += conn.execute(f"DELETE FROM instances WHERE id IN ({marks})",
                                        chunk).rowcount
        return deleted

    def check(self) -> builtins.list[str]:
        problems = [f"integrity_check: {row[0]}" for row in
                    self._read("PRAGMA integrity_check") if row[0] != "ok"]
        for name, sql in sqlite_read.CHECKS:
            problems += [sqlite_read.describe(name, tuple(row)) for row in self._read(sql)]
        return problems

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r}, format={FORMAT_VERSION})"


class _ClaimTxn:
    """``claims.claim``'s view of a SQLite write transaction (its lock serialises every
    claimer already: ``lock`` has nothing to add)."""

    def __init__(self, conn: sqlite3.Connection, request: ClaimRequest) -> None:
        self.conn, self.request = conn, request

    def rows(self, sql: str, args: Sequence[object]) -> builtins.list[Any]:
        return self.conn.execute(sql, args).fetchall()

    def lock(self, name: str) -> None:
        return None

    def take(self, cond: str, args: Sequence[object], limit: int) -> builtins.list[InstanceRecord]:
        sql = select(_INSTANCE.columns) + cond + " ORDER BY i.key LIMIT ?"
        out: builtins.list[InstanceRecord] = []
        req = self.request
        found = []
        for data in map(dict, self.conn.execute(sql, [*args, limit]).fetchall()):
            prior = data.pop("prior_heartbeat")
            found.append((_INSTANCE.decode(data), prior))
        for rec, prior in claims.takeable(req, found, self):  # ends the leases it takes from
            new, history = take(rec, req, prior)
            blobs: Blobs = []
            cols, values = _changes(rec, new, blobs)
            SqliteStore._put_blobs(self.conn, blobs)
            self.conn.execute(_update_sql(cols, True), [*values, rec.key, rec.id, rec.version])
            if history is not None:  # a takeover: its history row, in the claim's transaction
                encoded = _HISTORY.values(history)
                encoded[0] = rec.key
                self.conn.execute(_INSERT_HISTORY, encoded)
            new.version = rec.version + 1
            out.append(new)
        return out


class _Txn:
    """``BEGIN IMMEDIATE`` … ``COMMIT``; rolls back on any exception."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            self.store._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            self.store._lock.release()
            raise StoreError(f"database {self.store.path}: {exc}") from None
        return self.store._conn

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        conn = self.store._conn
        try:
            if exc_type is None:
                conn.execute("COMMIT")
            else:
                conn.execute("ROLLBACK")
        except sqlite3.DatabaseError as err:
            raise StoreError(f"database {self.store.path}: {err}") from None
        finally:
            self.store._lock.release()
        if isinstance(exc, sqlite3.DatabaseError):
            raise StoreError(f"database {self.store.path}: {exc}") from None

