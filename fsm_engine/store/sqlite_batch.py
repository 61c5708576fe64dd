"""History rows of a group commit on SQLite, by one statement (``SqliteStore.commit``'s).

A batch of a few hundred steps spends a good part of its time in the ``sqlite3``
module's per-call work (finding the cached statement, binding, resetting):
``executemany`` pays it once for the lot (~2 µs a row less, measured on 500-row
batches).  The applied plain steps' history rows are inserted at the end of their
batch, in its transaction; a refused row is found one at a time in a savepoint and
reported for its step (``StepRejected`` with its index in the batch), and the caller
rolls the whole transaction back, as for any refusal.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..errors import StepRejected
from .codec import INSERT_HISTORY
from .records import StepCommit

#: ``(index of the step in its batch, encoded history row)`` waiting for ``insert_history``.
Rows = list[tuple[int, list[Any]]]
#: What a step's values or a constraint (not the disk) raise from ``sqlite3``.
REFUSED = (sqlite3.IntegrityError, OverflowError)


def rejected(step: StepCommit, index: int, exc: Exception) -> StepRejected:
    """The error refusing ``step`` (``index`` in its batch) for a value or a constraint."""
    return StepRejected(f"the store refused a step of instance {step.record.id}: "
                        f"{type(exc).__name__}: {exc}", index=index, instance_id=step.record.id)


def insert_history(conn: sqlite3.Connection, rows: Rows, steps: Sequence[StepCommit]) -> None:
    """Insert the batch's deferred history rows at once; when one is refused, find it
    (one at a time, in a savepoint) and raise ``StepRejected`` for its step."""
    conn.execute("SAVEPOINT history")
    try:
        conn.executemany(INSERT_HISTORY, [row for _, row in rows])
    except REFUSED:
        conn.execute("ROLLBACK TO history")
        for i, row in rows:
            try:
                conn.execute(INSERT_HISTORY, row)
            except REFUSED as exc:
                raise rejected(steps[i], i, exc) from None
    conn.execute("RELEASE history")
