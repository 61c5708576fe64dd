"""Durable storage: the ``Store`` interface, its SQLite and PostgreSQL backends, and
``open_store`` choosing one by URL."""

from __future__ import annotations

import os

from ..errors import StoreError
from .base import Store
from .claims import ClaimRequest
from .records import (
    CANCELLED, COMPLETED, FAILED, FINAL_STATUSES, PENDING, RUNNING, WAITING, AttemptRow,
    BreakerRow, DefinitionRow, HistoryRow, InstanceFilter, InstanceRecord, OutboxBegin,
    OutboxRow, ReplyRow,
    ReviewDecision,
    ReviewItem,
    StepCommit, StepRow, WorkerRow,
)
from .sqlite import SqliteStore

#: The environment variable naming the store when no URL is given.
ENV = "FSM_DB"
DEFAULT = "fsm.db"
_POSTGRES = ("postgresql://", "postgres://")


def store_url(url: str | None = None) -> str:
    """``url``, else ``$FSM_DB``, else ``fsm.db`` (a SQLite file in the current directory)."""
    return url or os.environ.get(ENV) or DEFAULT


def is_postgres(url: str) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL."""
    return url.startswith(_POSTGRES)


def sqlite_path(url: str) -> str:
    """The file of a SQLite URL: ``sqlite:///rel.db``, ``sqlite:////abs.db``,
    ``sqlite://`` (in memory) or a plain path."""
    if not url.startswith("sqlite:"):
        return url
    rest = url[len("sqlite:"):]
    if rest in ("", "//", "///:memory:", "//:memory:"):
        return ":memory:"
    if not rest.startswith("///"):
        raise StoreError(f"bad SQLite URL {url!r}: write sqlite:///relative.db or "
                         "sqlite:////absolute.db")
    return rest[3:]


def open_store(url: str | None = None, *, create: bool = True,
               synchronous: str = "FULL", readonly: bool = False) -> Store:
    """Open the store named by ``url`` (see ``store_url``).

    ``postgresql://user:pass@host:port/db`` opens PostgreSQL (needs the
    ``[postgres]`` extra); ``sqlite:///path`` or a plain path opens a SQLite
    file (``synchronous`` applies to it).  ``create`` False refuses a database
    that does not exist yet (``StoreError``) instead of creating it; an older
    schema is migrated forward on open either way.

    ``readonly`` (the viewer) opens an existing database for reading only: nothing
    is written, not even a migration (an older schema is refused with a hint), and
    ``create`` is ignored; on PostgreSQL every transaction is read-only.

    Raises ``StoreError`` (unreachable, refused, newer schema, missing) or
    ``NotAnFsmDatabase`` (someone else's database), each one line.  With
    ``FSM_CRASH_AT`` set (fault-injection tests) the store is armed to stop its own
    process at one write (``fsm_engine.testing.crash``).
    """
    store = _open(store_url(url), create=create, synchronous=synchronous, readonly=readonly)
    if os.environ.get("FSM_CRASH_AT"):
        from ..testing.crash import arm
        arm(store)
    return store


def _open(url: str, *, create: bool, synchronous: str, readonly: bool) -> Store:
    if is_postgres(url):
        try:
            from .postgres import PostgresStore
        except ImportError:
            raise StoreError("a postgresql:// store needs psycopg: "
                             "pip install 'fsm_engine[postgres]'") from None
        return PostgresStore(url, create=create and not readonly, readonly=readonly)
    path = sqlite_path(url)
    if readonly:
        return SqliteStore(path, readonly=True)
    if not create and path != ":memory:" and (
            not os.path.exists(path) or (os.path.isfile(path) and not os.path.getsize(path))):
        raise StoreError(f"no database at {path} (run `fsm run` first, or pass --db)")
    return SqliteStore(path, synchronous=synchronous)


__all__ = ["Store", "SqliteStore", "open_store", "store_url", "is_postgres", "ClaimRequest",
           "InstanceRecord", "HistoryRow", "AttemptRow", "OutboxBegin", "OutboxRow", "WorkerRow",
           "BreakerRow",
           "StepCommit", "InstanceFilter", "StepRow", "ReviewItem", "ReviewDecision", "ReplyRow",
           "DefinitionRow",
           "PENDING", "RUNNING", "WAITING",
           "COMPLETED", "FAILED", "CANCELLED", "FINAL_STATUSES"]
