"""The SQLite backend: ``SqliteStore`` (one file, WAL journal, one transaction per batch of
steps).  ``connect`` opens the file and owns the transactions, ``steps`` writes instances and
their steps (the hot path), ``store`` the other facets."""

from __future__ import annotations

from ..codec import dumps as _dumps  # noqa: F401  (the store's JSON; tests import it from here)
from .connect import BLOB_THRESHOLD
from .store import SqliteStore

__all__ = ["SqliteStore", "BLOB_THRESHOLD"]
