"""A group commit of plain steps as one PostgreSQL statement (``PostgresStore.commit``).

The batch travels as binary arrays, one per column, unpacked by ``unnest``; one
statement with data-modifying CTEs applies every step's compare-and-set UPDATE
(``instances.version`` must still be the step's ``expected_version``) and writes
the history, attempt, outbox and blob rows of exactly the steps whose UPDATE
applied.  It runs alone, in autocommit: one statement is one transaction, so the
batch costs one round trip and one fsync, and each step is still all-or-nothing
(its rows are joined to its applied UPDATE).  Compared with a statement per row
(measured by ``bench/scale_out.py``), the server runs one executor instead of
two or three per step and the client adapts a few arrays instead of each row's
parameters.

A step changes only some columns: each step carries a bit mask of the columns it
sets, and an unset column keeps the row's value (``CASE WHEN mask & bit``), so an
unchanged large value is neither sent nor rewritten (PostgreSQL keeps its TOAST
pointer).  ``plain`` says which batches fit: every step by key, each instance once
(a row is updated at most once per statement), no review, family, wake, stream-log
tail or hand-off; the others take the general path, as does a batch whose statement breaks a
constraint (nothing of it applied; the general path then names the step at fault).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.types.array import ListBinaryDumper

from .codec import ATTEMPT, DELTA, HISTORY, MUTABLE, Blobs, Encoded
from .records import StepCommit

#: PostgreSQL types of the columns a step may set (``pg_schema``).
_TYPES = {
    "fingerprint": "text", "state": "text", "status": "text", "max_transitions": "int4",
    "token_budget": "int8", "updated_at": "float8", "reason": "text", "last_error": "text",
    "seq": "int4", "loop_count": "int4", "tokens_used": "int8", "attempt": "int4",
    "next_attempt_at": "float8", "deadline": "float8", "owner": "text", "recoveries": "int4",
    "recovered_seq": "int4", "machine_version": "int4", "queue": "text", "visits": "text",
    "context": "text", "context_refs": "text", "pause_request": "text",
    # history
    "instance": "int8", "source": "text", "dest": "text", "trigger": "text", "at": "float8",
    "kind": "text", "guards": "text", "duration_ms": "float8", "tokens": "int8",
    "error": "text", "delta": "text", "detail": "text",
    # attempts
    "instance_id": "text", "visit": "int4", "error_class": "text", "next_at": "float8",
}
_BIT = {col: 1 << i for i, col in enumerate(MUTABLE)}


class _Int8s(list[Any]):
    """Values sent as one ``int8[]`` (cast in SQL where the column is narrower)."""


class _Float8s(list[Any]):
    """Values sent as one ``float8[]``."""


class _Texts(list[Any]):
    """Values sent as one ``text[]``."""


#: Each array's Python class by the SQL type of its column.
_ARRAY = {"int4": _Int8s, "int8": _Int8s, "float8": _Float8s, "text": _Texts}


def _register() -> None:
    """Binary dumpers of fixed type for the arrays: psycopg would otherwise type each list
    by its values (``int2[]`` for small numbers, unknown for all-NULL ones), giving the one
    statement a different signature, hence another prepared statement and plan, from batch
    to batch."""
    for cls, name in ((_Int8s, "int8"), (_Float8s, "float8"), (_Texts, "text")):
        info = psycopg.adapters.types[name]
        dumper = type(f"{cls.__name__}Dumper", (ListBinaryDumper,),
                      {"oid": info.array_oid, "element_oid": info.oid})
        psycopg.adapters.register_dumper(cls, dumper)


_register()
_HISTORY = ("instance", *HISTORY.columns[1:])
_ATTEMPT = ATTEMPT.columns
# a column added to a record must be given its SQL type here (fails at import, not in a commit)
assert set(MUTABLE) | set(_HISTORY) | set(_ATTEMPT) <= _TYPES.keys()


def _arrays(types: Sequence[str]) -> list[list[Any]]:
    """One empty array of the right class per column."""
    return [_ARRAY[t]() for t in types]


_STEP_TYPES = ("int4", "int8", "text", "int4", "int8", *(_TYPES[c] for c in MUTABLE))
_HISTORY_TYPES = ("int4", *(_TYPES[c] for c in _HISTORY))
_ATTEMPT_TYPES = ("int4", *(_TYPES[c] for c in _ATTEMPT))
_OUTBOX_TYPES = ("int4", "text", "float8", "text")
_BLOB_TYPES = ("int4", "text", "text")


def _unnest(alias: str, cols: Sequence[str], types: Sequence[str], first: int) -> str:
    """``unnest`` of one array parameter per column (``$first`` on)."""
    args = ", ".join(f"${first + i}::{t}[]" for i, t in enumerate(types))
    return f"unnest({args}) AS {alias}({', '.join(cols)})"


@functools.lru_cache(maxsize=1)
def statement() -> str:
    """The batch statement, with PostgreSQL's own ``$n`` placeholders (run by a
    ``psycopg.RawCursor``: psycopg parses a ``%s`` query this long on every call); its
    parameters are ``Batch.params()``, its rows the ordinals of the steps that applied."""
    sets = ", ".join(f"{c} = CASE WHEN v.mask & {_BIT[c]} <> 0 THEN v.{c} ELSE i.{c} END"
                     for c in MUTABLE)
    first = 1
    parts = []
    for alias, cols, types in (("v", ("ord", "key", "id", "version", "mask", *MUTABLE),
                                _STEP_TYPES),
                               ("r", ("ord", *_HISTORY), _HISTORY_TYPES),
                               ("r", ("ord", *_ATTEMPT), _ATTEMPT_TYPES),
                               ("r", ("ord", "result", "updated_at", "key"), _OUTBOX_TYPES),
                               ("r", ("ord", "hash", "data"), _BLOB_TYPES)):
        parts.append(_unnest(alias, cols, types, first))
        first += len(types)
    steps, history, attempts, outbox, blobs = parts
    return (
        f"WITH u AS (UPDATE instances i SET {sets}, version = i.version + 1 FROM {steps} "
        "WHERE i.key = v.key AND i.id = v.id AND i.version = v.version RETURNING v.ord), "
        f"h AS (INSERT INTO history({', '.join(_HISTORY)}) SELECT "
        f"{', '.join('r.' + c for c in _HISTORY)} FROM {history} JOIN u ON u.ord = r.ord), "
        f"a AS (INSERT INTO attempts({', '.join(_ATTEMPT)}) SELECT "
        f"{', '.join('r.' + c for c in _ATTEMPT)} FROM {attempts} JOIN u ON u.ord = r.ord), "
        f"o AS (UPDATE outbox SET status = 'done', result = r.result, updated_at = r.updated_at "
        f"FROM {outbox} JOIN u ON u.ord = r.ord WHERE outbox.key = r.key), "
        f"b AS (INSERT INTO blobs(hash, data) SELECT DISTINCT ON (r.hash) r.hash, r.data "
        f"FROM {blobs} JOIN u ON u.ord = r.ord ON CONFLICT DO NOTHING) "
        "SELECT ord FROM u")


def plain(steps: Sequence[StepCommit]) -> bool:
    """True when the batch fits the one statement (see the module docstring)."""
    keys = set()
    for s in steps:
        rec = s.record
        if (rec.key is None or s.review_close is not None or s.review_open is not None
                or s.close_reviews is not None or s.compound or s.wake or s.stream
                or (rec.owner is None and rec.status == "running")):
            return False
        keys.add(rec.key)
    return len(keys) == len(steps)


class Batch:
    """The columns of one batch statement, filled step by step (``add``)."""

    def __init__(self) -> None:
        self.steps = _arrays(_STEP_TYPES)
        self.history = _arrays(_HISTORY_TYPES)
        self.attempts = _arrays(_ATTEMPT_TYPES)
        self.outbox = _arrays(_OUTBOX_TYPES)
        self.blobs = _arrays(_BLOB_TYPES)

    def add(self, ord_: int, step: StepCommit, enc: Encoded, threshold: int,
            shrink: Any) -> None:
        """Step ``ord_`` with its encoded values; a history delta longer than ``threshold``
        is replaced by ``shrink(delta, large, blobs)`` (its large values in ``blobs``)."""
        cols, values, rows, attempt, outbox, large = enc
        rec = step.record
        mask, at = 0, dict(zip(cols, values, strict=True))
        for c in cols:
            mask |= _BIT[c]
        _push(self.steps, (ord_, rec.key, rec.id, step.expected_version, mask,
                           *(at.get(c) for c in MUTABLE)))
        extra: Blobs = []
        for h, encoded in zip(step.history, rows, strict=True):
            row = list(encoded)
            row[0] = rec.key
            if len(row[DELTA]) > threshold:
                row[DELTA] = shrink(h.delta, large, extra)
            _push(self.history, (ord_, *row))
        if attempt is not None:
            _push(self.attempts, (ord_, *attempt))
        if outbox is not None:
            _push(self.outbox, (ord_, *outbox))
        for digest, data in (*large, *extra):
            _push(self.blobs, (ord_, digest, data))

    def params(self) -> list[list[Any]]:
        """The statement's parameters, in order."""
        return [*self.steps, *self.history, *self.attempts, *self.outbox, *self.blobs]


def _push(columns: list[list[Any]], values: Iterable[Any]) -> None:
    """Append one row's ``values`` to the column arrays, one value each."""
    for column, value in zip(columns, values, strict=True):
        column.append(value)
