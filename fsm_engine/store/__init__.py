"""Durable storage: the ``Store`` interface and its SQLite backend."""

from .base import Store
from .records import (
    CANCELLED, COMPLETED, FAILED, FINAL_STATUSES, PENDING, RUNNING, WAITING, AttemptRow,
    BreakerRow, HistoryRow, InstanceFilter, InstanceRecord, OutboxRow, StepCommit, StepRow,
    WorkerRow,
)
from .sqlite import SqliteStore


def open_store(path: str = "fsm.db", *, synchronous: str = "FULL") -> Store:
    """Open the store at ``path`` (a SQLite file; created when missing)."""
    return SqliteStore(path, synchronous=synchronous)


__all__ = ["Store", "SqliteStore", "open_store", "InstanceRecord", "HistoryRow", "AttemptRow",
           "OutboxRow", "WorkerRow", "BreakerRow", "StepCommit", "InstanceFilter", "StepRow", "PENDING", "RUNNING",
           "WAITING", "COMPLETED", "FAILED", "CANCELLED", "FINAL_STATUSES"]
