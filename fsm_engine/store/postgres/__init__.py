"""The PostgreSQL backend (psycopg 3): ``PostgresStore``, the same records and contract as
the SQLite store.  ``connect`` holds the connections and transactions, ``steps`` writes
instances and their steps (the group commit, SQL in ``store.pg_commit``), ``store`` the
other facets."""

from __future__ import annotations

from .connect import BLOB_THRESHOLD, CHANNEL, MAX_IDLE
from .store import PostgresStore

__all__ = ["PostgresStore", "BLOB_THRESHOLD", "CHANNEL", "MAX_IDLE"]
