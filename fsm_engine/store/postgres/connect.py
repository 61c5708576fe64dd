"""The PostgreSQL store's connections: a pool of idle ones, the heartbeat's side one, one
call's transaction (``_run``), reads, and the large values beside the rows; the facets'
methods live in ``steps`` (the hot path) and ``store``."""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from ...errors import NotAnFsmDatabase, StoreError
from ...process import session_name
from ...redaction import redact
from .. import leases, pg_read
from ..codec import (
    ATTEMPT,
    BREAKER,
    CONTEXT_THRESHOLD,
    INSERT_HISTORY,
    INSTANCE,
    SELECT_HISTORY,
    SELECT_INSTANCES,
    WORKER,
    Blobs,
    Codec,
    marks,
    resolve,
)
from ..pg_schema import migrate, require_current
from ..records import (
    FORMAT_VERSION,
    HistoryRow,
    InstanceRecord,
    OutboxRow,
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
_SQL_WAKE = ("UPDATE instances SET status='running', updated_at=%s, version=version+1, "
             "next_attempt_at=NULL "
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
    lines = (" ".join(line.split()) for line in redact(exc).splitlines())
    text = "; ".join(line for line in lines if line) or type(exc).__name__  # libpq's lines
    return text[:300]  # are sentences without a full stop: kept apart


class PostgresBase:
    """The connections of a ``PostgresStore`` (see there): the pool, the side connection,
    one call's transaction and reads."""

    remote = True

    def __init__(self, url: str, *, create: bool = True, connect_timeout: float = 5.0,
                 blob_threshold: int = BLOB_THRESHOLD, readonly: bool = False) -> None:
        self._dsn = url
        self.readonly = readonly
        self.url = redact(url)
        try:
            self._session: dict[str, Any] = pg_read.session_options(url, readonly=readonly)
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
                                   application_name=session_name(),
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

    def _expand(self, row: HistoryRow) -> HistoryRow:
        for key, value in row.delta.items():
            if isinstance(value, dict) and len(value) == 1 and "$blob" in value:
                data = self._rows("SELECT data FROM blobs WHERE hash=%s", (value["$blob"],))
                row.delta[key] = json.loads(data[0]["data"]) if data else None
        return row

    def close(self) -> None:
        with self._pool_lock, self._side_lock:
            self._generation += 1
            for conn in (*self._idle, self._listener, self._side):
                if conn is not None:
                    conn.close()
            self._idle, self._listener, self._side = [], None, None

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r}, format={FORMAT_VERSION})"
