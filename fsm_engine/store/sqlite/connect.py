"""The SQLite store's connection: opening the file, one lock, the write transaction
(``BEGIN IMMEDIATE`` … ``COMMIT``) and reads, and the rows' decoding; the facets' methods
live in ``steps`` (the hot path) and ``store``."""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import sys
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, cast

from ...errors import NotAnFsmDatabase, StoreError
from ..codec import (
    ATTEMPT as _ATTEMPT,
)
from ..codec import (
    INSTANCE as _INSTANCE,
)
from ..codec import (
    JSON_COLUMNS,
    Blobs,
)
from ..codec import (
    resolve as _resolve,
)
from ..records import (
    FORMAT_VERSION,
    HistoryRow,
    InstanceRecord,
    WorkerRow,
)
from ..schema import migrate, read_version, refuse_foreign
from . import busy

_HEADER = b"SQLite format 3\x00"


def _bind_none_directly() -> None:
    """Register the identity adapter for ``None`` parameters (``{}.get``, a builtin: ``None``
    in, ``None`` out), unless one is registered already.  CPython's ``sqlite3`` binds only
    exact ``int``/``float``/``str`` without its adapter protocol (``need_adapt`` in
    ``Modules/_sqlite/cursor.c``): every other value, ``None`` included, looks up
    ``PrepareProtocol.__adapt__`` and ``None.__conform__``, two ``AttributeError``s raised
    and cleared per NULL parameter (~0.4 µs each, measured; a step's rows bind several).
    With an adapter registered for its type the lookup ends at the registry.  Nothing a
    caller sees changes: ``None`` is still bound as SQL NULL."""
    key = (type(None), sqlite3.PrepareProtocol)
    if key not in sqlite3.adapters:
        sqlite3.register_adapter(type(None), cast("Callable[[None], None]", {}.get))


_bind_none_directly()

#: History delta values whose JSON is longer than this (characters) are stored
#: once in ``blobs`` by SHA-256 and referenced as ``{"$blob": hash}``.
BLOB_THRESHOLD = 64 * 1024



def as_dict(row: sqlite3.Row) -> dict[str, Any]:
    """``row`` as a column -> value dict in one pass, its names interned.

    ``dict(row)`` looks each column up by name, comparing it with every name before it, and
    ``cls(**data)`` matches each keyword to a parameter by identity before it compares
    strings: both quadratic in the columns (43 of an instance row) without this, about half a
    claim's instructions per row (callgrind, 512-row claims)."""
    return dict(zip(map(sys.intern, row.keys()), row, strict=True))


def _decode(cls: type, row: sqlite3.Row) -> Any:
    data = as_dict(row)
    for col in JSON_COLUMNS & data.keys():
        if data[col] is not None:
            data[col] = json.loads(data[col])
    return cls(**data)


def _decode_worker(row: sqlite3.Row) -> WorkerRow:
    worker: WorkerRow = _decode(WorkerRow, row)
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


class SqliteBase:
    """One SQLite connection of a ``SqliteStore`` (see there) and its transactions."""


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
            self._conn.execute("PRAGMA busy_timeout = 0")  # open: the store waits (``busy``)
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
    def begin(self) -> None:
        """``BEGIN IMMEDIATE`` once (``_Txn`` tries it again while the file is locked:
        ``busy.retry``)."""
        self._conn.execute("BEGIN IMMEDIATE")

    def _write(self) -> _Txn:
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
                try:  # the first try inline, as ``_Txn`` does
                    return cursor.execute(sql, args).fetchall()
                except sqlite3.OperationalError as exc:
                    if not busy.busy(exc):
                        raise
                return busy.retry(lambda: cursor.execute(sql, args).fetchall())
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"database {self.path}: {exc}") from None


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


    def _expand(self, row: HistoryRow) -> HistoryRow:
        for key, value in row.delta.items():
            if isinstance(value, dict) and len(value) == 1 and "$blob" in value:
                data = self._read("SELECT data FROM blobs WHERE hash=?", (value["$blob"],))
                row.delta[key] = json.loads(data[0][0]) if data else None
        return row

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r}, format={FORMAT_VERSION})"



class _Txn:
    """``BEGIN IMMEDIATE`` … ``COMMIT``; rolls back on any exception."""

    def __init__(self, store: SqliteBase) -> None:
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            try:  # the first try inline: a free file (the common case) costs one call
                self.store._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not busy.busy(exc):
                    raise
                busy.retry(self.store.begin)  # locked: wait for it (``busy``)
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
