"""Durable storage: the ``Store`` interface, its SQLite and PostgreSQL backends, and
``open_store`` choosing one by URL."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .records import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FINAL_STATUSES,
    PENDING,
    RUNNING,
    WAITING,
    AttemptRow,
    BreakerRow,
    DefinitionRow,
    HistoryRow,
    InstanceFilter,
    InstanceRecord,
    OutboxBegin,
    OutboxRow,
    ReplyRow,
    ReviewDecision,
    ReviewItem,
    StepCommit,
    StepRow,
    WorkerRow,
)

if TYPE_CHECKING:
    from .backends import sqlite_path as sqlite_path  # the old home of this name
    from .base import Store
    from .claims import ClaimRequest
    from .sqlite import SqliteStore

#: Names imported on first use (PEP 562), so that ``store.records`` and ``store_url`` come
#: without the backends: ``fsm --help`` imports no SQLite store.
_LAZY = {"Store": ".base", "ClaimRequest": ".claims", "SqliteStore": ".sqlite",
         "sqlite_path": ".backends", "backends": "."}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    if where == ".":
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value

#: The environment variable naming the store when no URL is given.
ENV = "FSM_DB"
DEFAULT = "fsm.db"


def store_url(url: str | None = None) -> str:
    """``url``, else ``$FSM_DB``, else ``fsm.db`` (a SQLite file in the current directory)."""
    return url or os.environ.get(ENV) or DEFAULT


def is_postgres(url: str) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL."""
    from . import backends
    return backends.opener_for(url) is backends.open_postgres


def open_store(url: str | None = None, *, create: bool = True,
               synchronous: str = "FULL", readonly: bool = False) -> Store:
    """Open the store named by ``url`` (see ``store_url``) with the backend registered for
    its scheme (``store.backends``).

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
    process at one write (``fsm_engine.store.crash``).
    """
    from . import backends
    url = store_url(url)
    store = backends.opener_for(url)(url, create=create, synchronous=synchronous,
                                     readonly=readonly)
    if os.environ.get("FSM_CRASH_AT"):  # the intersection tests' crash points (store.crash)
        from .crash import arm
        arm(store)
    return store


__all__ = ["Store", "SqliteStore", "open_store", "store_url", "is_postgres", "ClaimRequest",
           "InstanceRecord", "HistoryRow", "AttemptRow", "OutboxBegin", "OutboxRow", "WorkerRow",
           "BreakerRow",
           "StepCommit", "InstanceFilter", "StepRow", "ReviewItem", "ReviewDecision", "ReplyRow",
           "DefinitionRow",
           "PENDING", "RUNNING", "WAITING",
           "COMPLETED", "FAILED", "CANCELLED", "FINAL_STATUSES"]
