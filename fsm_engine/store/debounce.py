"""``Store.debounce``'s SQL, shared by every backend (no I/O here).

A debounced start (``runtime.start_options``) either folds into the one ``scheduled``
instance of its machine holding its ``debounce_key`` — one UPDATE: that instance's
context and input become the new start's, its due time (``next_attempt_at``) moves to the
new start's, never past its ``debounce_until`` — or, when there is none, inserts itself.
A partial unique index (``schema.START_OPTIONS``: one scheduled instance per machine and
key) refuses a second insert racing the first; the loser folds into the winner.
"""

from __future__ import annotations

import builtins
from typing import Any

from .codec import INSTANCE, Blobs, instance_row
from .records import InstanceRecord

_AT = {c: INSTANCE.columns.index(c) for c in ("context", "context_refs", "input")}

#: Fold a start into its burst (``{least}``: the backend's two-argument minimum).
FOLD = ("UPDATE instances SET context=?, context_refs=?, input=?, "
        "next_attempt_at={least}(?, COALESCE(debounce_until, ?)), updated_at=?, "
        "version=version+1 WHERE machine=? AND debounce_key=? AND status='scheduled' "
        "RETURNING id")
#: The partial unique index a racing insert runs into.
INDEX = "idx_instances_debounce"


def fold_args(rec: InstanceRecord, blobs: Blobs) -> builtins.list[Any]:
    """``FOLD``'s arguments for the new start ``rec`` (its large values to ``blobs``)."""
    row = instance_row(rec, blobs)
    due = rec.next_attempt_at
    return [row[_AT["context"]], row[_AT["context_refs"]], row[_AT["input"]], due, due,
            rec.created_at, rec.machine, rec.debounce_key]
