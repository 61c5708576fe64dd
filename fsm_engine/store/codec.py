"""Records as table rows, shared by every SQL backend (no I/O here).

A record class's columns are its dataclass fields in declared order; JSON
columns (``schema.JSON_COLUMNS``) are encoded to compact UTF-8 text, so a
value reads back identically from SQLite and PostgreSQL.  SQL is written
with ``?`` placeholders; a backend with another paramstyle rewrites them
(``marks``).
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import fields
from itertools import compress
from typing import Any, NamedTuple

import pydantic_core

from ..errors import StepRejected, StoreError
from .records import (
    AGING_S,
    AttemptRow,
    BreakerRow,
    ChildOutput,
    HistoryRow,
    InstanceRecord,
    ReplyRow,
    ReviewItem,
    StepCommit,
    WorkerRow,
)

#: Columns holding JSON (text) in every backend.
JSON_COLUMNS = frozenset({"context", "context_refs", "input", "visits", "guards", "delta",
                          "detail", "result", "events", "queues", "show", "choices", "editable",
                          "edit", "fork_options"})

_ENCODE_ASCII = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True,
                                 allow_nan=False).encode


def dumps(value: Any) -> str:
    """Compact, strict UTF-8 JSON of a JSON value.

    Encoded by pydantic-core's Rust serializer (about 8x ``json.dumps`` on a
    small dict); strings it cannot encode as UTF-8 (lone surrogates, e.g.
    from undecodable file names) are kept as ``\\u`` escapes by ``json``.
    Raises ``TypeError`` for a value JSON cannot hold and ``ValueError`` for
    NaN or ±Infinity (never written as the bare tokens SQLite's JSON1 and
    PostgreSQL's ``jsonb`` reject).
    """
    if not value and isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    try:
        text = pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError:
        return _ENCODE_ASCII(value)
    out = text.decode()
    # (searched as ``str``: ``bytes in bytes`` first tries the needle as an int and raises and
    # clears a TypeError inside CPython 3.11 every time, ~4x the cost of the search)
    if "NaN" in out or "Infinity" in out:  # maybe a non-finite float: json raises for one
        _ENCODE_ASCII(value)
    return out


def marks(sql: str) -> str:
    """``sql`` with its ``?`` placeholders as ``%s`` (psycopg's paramstyle)."""
    return sql.replace("?", "%s")


class Codec:
    """One record class as a table row: its columns in declared order, values positional."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.columns = tuple(f.name for f in fields(cls))
        self._get = operator.attrgetter(*self.columns)
        self._json = tuple(i for i, col in enumerate(self.columns) if col in JSON_COLUMNS)
        self._json_names = tuple(self.columns[i] for i in self._json)

    def values(self, obj: Any, skip: tuple[str, ...] = ()) -> builtins.list[Any]:
        """``obj``'s values in column order, JSON columns encoded (``None`` stays NULL;
        the columns in ``skip`` are left as they are, for the caller to fill)."""
        row = list(self._get(obj))
        for i in self._json:
            if row[i] is not None and self.columns[i] not in skip:
                row[i] = dumps(row[i])
        return row

    def from_values(self, row: builtins.list[Any]) -> Any:
        """The record from ``row``, its values in column order (a plain tuple row read as a
        list), JSON columns decoded in place: no name looked up (a claim's 512 rows: a dict
        per row built and taken apart cost about a sixth of the claim's Python)."""
        for i in self._json:
            text = row[i]
            if text is not None:
                row[i] = {} if text == "{}" else [] if text == "[]" else json.loads(text)
        return self.cls(*row)

    def insert_sql(self, table: str, verb: str = "INSERT") -> str:
        """``verb INTO table(columns) VALUES (?, …)`` taking ``values``' order."""
        qs = ", ".join("?" * len(self.columns))
        return f"{verb} INTO {table}({', '.join(self.columns)}) VALUES ({qs})"

    def decode(self, data: dict[str, Any]) -> Any:
        """The record from a row as a column → value mapping (JSON columns decoded; an
        empty object or list, the most common value of several, without a parse)."""
        for col in self._json_names:
            text = data.get(col)
            if text is not None:
                data[col] = {} if text == "{}" else [] if text == "[]" else json.loads(text)
        if len(data) == len(self.columns):  # positional: ``cls(**data)`` compares each
            try:                            # keyword with the parameter names (quadratic)
                return self.cls(*map(data.__getitem__, self.columns))
            except KeyError:
                pass
        return self.cls(**data)


INSTANCE, HISTORY, ATTEMPT, WORKER, BREAKER = map(
    Codec, (InstanceRecord, HistoryRow, AttemptRow, WorkerRow, BreakerRow))
DELTA = HISTORY.columns.index("delta")
_CONTEXT_AT, _REFS_AT = INSTANCE.columns.index("context"), INSTANCE.columns.index("context_refs")
_INPUT_AT = INSTANCE.columns.index("input")
#: The ``context_refs`` key prefix of a large start-input value (``$input.doc``; no context
#: field can be named so): a row rewritten by a step never carries it along.
INPUT_REF = "$input."
SELECT_INSTANCES = f"SELECT {', '.join(INSTANCE.columns)} FROM instances"
#: History rows are stored under the instance's integer key, not its id (see ``schema._v2``).
INSERT_HISTORY = (f"INSERT INTO history(instance, {', '.join(HISTORY.columns[1:])}) "
                  f"VALUES ({', '.join('?' * len(HISTORY.columns))})")
SELECT_HISTORY = ("SELECT i.id AS instance_id, "
                  + ", ".join(f"h.{c}" for c in HISTORY.columns[1:])
                  + " FROM history h JOIN instances i ON i.key = h.instance WHERE i.id=?"
                  " ORDER BY h.seq")

REPLY = Codec(ReplyRow)
SELECT_REPLY = (f"SELECT {', '.join(REPLY.columns)} FROM replies WHERE key=? AND "
                "created_at >= ?")
PUT_REPLY = (REPLY.insert_sql("replies") + " ON CONFLICT (key) DO UPDATE SET "
             + ", ".join(f"{c}=excluded.{c}" for c in REPLY.columns[1:]))
REVIEW = Codec(ReviewItem)
SELECT_REVIEWS = f"SELECT {', '.join(REVIEW.columns)} FROM review_items"
#: Open a review item; a second open of the same (instance, state, visit) is a no-op.
INSERT_REVIEW = REVIEW.insert_sql("review_items") + " ON CONFLICT (id) DO NOTHING"
#: Decide an open item (args: by, at, choice, note, edit, id, claimer, claimer): only while
#: it is open and, for a claimer, unclaimed or claimed by that claimer.
CLOSE_REVIEW = ("UPDATE review_items SET status='decided', decided_by=?, decided_at=?, "
                "choice=?, note=?, edit=? WHERE id=? AND status='open' AND "
                "(CAST(? AS TEXT) IS NULL OR claimed_by IS NULL OR claimed_by=?)")
#: Close every open item of an instance undecided (args: by, at, note, instance id).
CLOSE_OPEN_REVIEWS = ("UPDATE review_items SET status='closed', decided_by=?, decided_at=?, "
                      "note=? WHERE instance_id=? AND status='open'")
#: Claim an open item (args: by, at, id, by): unclaimed or already this claimer's.
CLAIM_REVIEW = ("UPDATE review_items SET claimed_by=?, claimed_at=? WHERE id=? AND "
                "status='open' AND (claimed_by IS NULL OR claimed_by=?)")


def close_review_args(d: Any) -> builtins.list[Any]:
    """``CLOSE_REVIEW``'s arguments for a ``ReviewDecision``."""
    edit = None if d.edit is None else dumps(d.edit)
    return [d.by, d.at, d.choice, d.note, edit, d.item_id, d.claimer, d.claimer]


def close_open_args(step: StepCommit) -> tuple[str, float, str, str]:
    """``CLOSE_OPEN_REVIEWS``' arguments for a step with ``close_reviews``."""
    assert step.close_reviews is not None
    by, note = step.close_reviews
    return by, step.record.updated_at, note, step.record.id


def reviews_where(statuses: Any, machine: str | None, instance_id: str | None,
                  id_prefix: str | None) -> tuple[str, builtins.list[Any]]:
    """The WHERE clause (``?`` marks) and arguments of ``Store.reviews``."""
    sql, args = " WHERE 1=1", []  # type: tuple[str, builtins.list[Any]]
    if statuses:
        sql += f" AND status IN ({', '.join('?' * len(statuses))})"
        args.extend(statuses)
    for col, value in (("machine", machine), ("instance_id", instance_id)):
        if value is not None:
            sql += f" AND {col}=?"
            args.append(value)
    if id_prefix is not None:
        sql += " AND substr(id, 1, ?) = ?"
        args += [len(id_prefix), id_prefix]
    return sql + " ORDER BY created_at, id", args


#: Instance columns fixed at creation: never rewritten by a step (``max_transitions`` is
#: not: a reviewer's decision after a routed loop cap grants more; nor ``fingerprint``:
#: a migration moves it with ``machine_version``).
IMMUTABLE = frozenset({"id", "key", "version", "machine", "module", "input",
                       "created_at", "forked_from", "forked_at_seq",
                       "parent_id", "branch", "fork_options", "partition_key",
                       "start_key", "priority", "rank", "debounce_key", "debounce_until"})
#: Mutable JSON columns: encoded only when written, and written when ``before`` holds the
#: very same dict as ``after`` (an edit made in place would otherwise look unchanged).
DICTS = ("visits",)
#: The context's two columns: its small values inline, the large ones' hashes (format 9).
CONTEXT = ("context", "context_refs")
#: The other mutable instance columns, in table order.
SCALARS = tuple(col for col in INSTANCE.columns if col not in IMMUTABLE | set(DICTS + CONTEXT))
_SCALAR_VALUES = operator.attrgetter(*SCALARS)
#: Every mutable column, in the order ``changes`` gives them for ``before=None``.
MUTABLE = SCALARS + DICTS + CONTEXT
#: Context values whose JSON is longer than this (characters) are stored once in ``blobs``
#: by SHA-256 beside the instance row (``InstanceRecord.context_refs``).
CONTEXT_THRESHOLD = 4096
#: ``(hash, JSON text)`` of large values a write stores in ``blobs`` (insert-or-ignore).
Blobs = builtins.list[tuple[str, str]]
_SMALL = (int, float, bool, type(None))


def split_context(before: InstanceRecord | None, after: InstanceRecord, blobs: Blobs,
                  threshold: int = CONTEXT_THRESHOLD) -> tuple[str, dict[str, str]]:
    """``after.context`` as (JSON of its inline values, field → hash of each large value).

    A value ``before`` stored beside the row stays there unencoded when ``after``
    holds the very same object (the runtime keeps the objects of fields a step did
    not update) or does not hold the field at all (a record read without its large
    values).  Any other value is encoded; one longer than ``threshold`` characters
    goes to ``blobs`` (appended as ``(hash, text)``).  Cost: the inline part's size
    plus the size of the large values that changed, never of the unchanged ones.
    Raises what ``dumps`` raises.
    """
    old_refs = before.context_refs if before is not None else {}
    if not old_refs:  # the common case: nothing beside the row yet
        refs: dict[str, str] = {}
        return _spill(after.context, refs, blobs, threshold), refs
    old = before.context if before is not None else {}
    if old is after.context:  # one dict, maybe edited in place: identity proves nothing
        old = {}
    refs = {k: h for k, h in old_refs.items() if k not in after.context}
    inline: dict[str, Any] = {}
    for key, value in after.context.items():
        ref = old_refs.get(key)
        if ref is not None and key in old and old[key] is value:
            refs[key] = ref
        else:
            inline[key] = value
    return _spill(inline, refs, blobs, threshold), refs


def _spill(inline: dict[str, Any], refs: dict[str, str], blobs: Blobs, threshold: int,
           prefix: str = "") -> str:
    """The JSON of ``inline`` once each value longer than ``threshold`` is moved to
    ``blobs``, named in ``refs`` under ``prefix + key`` (``inline`` itself is not changed)."""
    text = dumps(inline)
    if len(text) <= threshold:
        return text
    inline = dict(inline)
    for key, value in builtins.list(inline.items()):
        if type(value) in _SMALL:
            continue
        encoded = dumps(value)
        if len(encoded) > threshold:
            # the same value twice in one write (the input's and the context's): hash it once
            digest = next((d for d, text in blobs if text == encoded), None)
            if digest is None:
                digest = hashlib.sha256(encoded.encode()).hexdigest()
                blobs.append((digest, encoded))
            refs[prefix + key] = digest
            del inline[key]
    return dumps(inline)


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """True when ``a`` holds exactly ``b``'s keys and very objects (so its JSON is ``b``'s:
    encoded once, not twice)."""
    if a is None or len(a) != len(b):
        return False
    for key, value in b.items():
        if a.get(key, a) is not value:
            return False
    return True


def instance_row(rec: InstanceRecord, blobs: Blobs,
                 threshold: int = CONTEXT_THRESHOLD) -> builtins.list[Any]:
    """``rec``'s values in column order for an INSERT (large context values to ``blobs``;
    ``rec.context_refs`` is set to where they went; ``rec.rank``, when ``None``, to its
    claim order: ``created_at - priority * AGING_S``)."""
    if rec.rank is None:
        rec.rank = rec.created_at - rec.priority * AGING_S
    text, rec.context_refs = split_context(None, rec, blobs, threshold)
    row = INSTANCE.values(rec, skip=CONTEXT + ("input",))
    if _same(rec.input, rec.context):  # a fresh start: the input's JSON is the context's
        row[_INPUT_AT] = text
        rec.context_refs.update([(INPUT_REF + k, h) for k, h in rec.context_refs.items()])
    elif rec.input is not None:  # large values beside the row too (the context's blobs)
        row[_INPUT_AT] = _spill(rec.input, rec.context_refs, blobs, threshold, INPUT_REF)
    row[_CONTEXT_AT], row[_REFS_AT] = text, dumps(rec.context_refs)
    return row


def changes(before: InstanceRecord | None, after: InstanceRecord, blobs: Blobs | None = None,
            threshold: int = CONTEXT_THRESHOLD
            ) -> tuple[tuple[str, ...], builtins.list[Any]]:
    """The instance columns to write and their values (JSON-encoded).

    Every mutable column when ``before`` is None, else those where ``after``
    differs from ``before`` (scalars compared with ``==``, JSON columns by
    their encoded text; the context as ``split_context`` splits it, so an
    unchanged large value is neither encoded nor written).  Large values that
    must be stored are appended to ``blobs``; ``after.context_refs`` is set.
    """
    blobs = [] if blobs is None else blobs
    text, refs = split_context(before, after, blobs, threshold)
    if before is None:  # the input column is not rewritten: its large values stay beside it
        refs.update((k, h) for k, h in after.context_refs.items() if k.startswith(INPUT_REF))
    after.context_refs = refs
    if before is None:
        values = [*_SCALAR_VALUES(after), dumps(after.visits), text, dumps(refs)]
        return MUTABLE, values
    scalars, values = scalar_changes(before, after)
    cols = [*scalars]
    old, new = before.visits, after.visits
    visits = dumps(new)
    # equal dicts may still differ in JSON (True == 1 == 1.0); one object may have
    # been edited in place
    if old is new or old != new or visits != dumps(old):
        cols.append("visits")
        values.append(visits)
    old_inline, new_inline = before.context, after.context
    if refs or before.context_refs:
        old_inline = {k: v for k, v in old_inline.items() if k not in before.context_refs}
        new_inline = {k: v for k, v in new_inline.items() if k not in refs}
    # encode before's only when equal: equal dicts may still differ in JSON (True == 1)
    if before.context is after.context or old_inline != new_inline or text != dumps(old_inline):
        cols.append("context")
        values.append(text)
    if refs != before.context_refs:
        cols.append("context_refs")
        values.append(dumps(refs))
    return tuple(cols), values


def scalar_changes(before: InstanceRecord, after: InstanceRecord
                   ) -> tuple[tuple[str, ...], builtins.list[Any]]:
    """The scalar instance columns (``SCALARS``) where ``after`` differs from ``before``,
    and their values: what a claim writes (``fleet.adoption.adopted`` moves owner, status, times
    and recovery counts, never a JSON column), so no JSON is encoded or compared."""
    news = _SCALAR_VALUES(after)  # the changed scalars picked in C (no call per column)
    moved = [*map(operator.ne, _SCALAR_VALUES(before), news)]
    return tuple(compress(SCALARS, moved)), [*compress(news, moved)]


def resolve(records: builtins.list[InstanceRecord],
            fetch: Callable[[builtins.list[str]], dict[str, str]]) -> builtins.list[InstanceRecord]:
    """Put the large values back into the contexts of ``records`` read from the store
    (``fetch``: hashes → their JSON text from ``blobs``); ``StoreError`` when one is gone."""
    wanted = sorted({h for rec in records for h in rec.context_refs.values()})
    if not wanted:
        return records
    found: dict[str, str] = {}
    for i in range(0, len(wanted), 500):
        found.update(fetch(wanted[i:i + 500]))
    for rec in records:
        for key, digest in rec.context_refs.items():
            if digest not in found:
                raise StoreError(f"instance {rec.id}: context value {key!r} (blob "
                                 f"{digest[:12]}) is missing from the store")
            if key.startswith(INPUT_REF):
                rec.input[key[len(INPUT_REF):]] = json.loads(found[digest])
            else:
                rec.context[key] = json.loads(found[digest])
    return records


def child_outputs(rows: Sequence[Sequence[Any]],
                  fetch: Callable[[builtins.list[str]], dict[str, str]]
                  ) -> builtins.list[ChildOutput]:
    """``ChildOutput``s of rows of ``CHILD_OUTPUT_COLUMNS`` (JSON text), their large values
    put back as ``resolve`` does; ``StoreError`` when one is gone."""
    def loads(text: str | None) -> Any:
        return {} if text is None else json.loads(text)
    outs = [_Refs(r[0], loads(r[1]), loads(r[2]), loads(r[3])) for r in rows]
    resolve(outs, fetch)  # type: ignore[arg-type]
    return [ChildOutput(o.id, o.context, o.input) for o in outs]


class _Refs(NamedTuple):
    id: str
    context: dict[str, Any]
    input: dict[str, Any]
    context_refs: dict[str, str]


@functools.lru_cache(maxsize=512)
def update_sql(cols: tuple[str, ...], by_key: bool) -> str:
    """Compare-and-set UPDATE of ``cols`` (positional: the values, then the instance's key
    and id, or its id alone, then the expected version).  By key it finds the row in
    one B-tree; by id it returns the key (``RETURNING`` costs ~15 µs a statement)."""
    sets = "".join(f"{col}=?, " for col in cols)
    where = "key=? AND id=? AND version=?" if by_key else "id=? AND version=? RETURNING key"
    return f"UPDATE instances SET {sets}version=version+1 WHERE {where}"


#: A step's values encoded for its statements: instance columns and values, history rows,
#: attempt row, outbox update (``None`` where the step has none), large context values.
Encoded = tuple[tuple[str, ...], builtins.list[Any], builtins.list[builtins.list[Any]],
                "builtins.list[Any] | None", "tuple[str, float, str] | None", Blobs]
UNENCODABLE = (TypeError, ValueError, OverflowError, RecursionError)


def encode_step(index: int, step: StepCommit) -> Encoded:
    """Every value ``step`` writes, encoded before any statement runs; ``StepRejected``
    (with ``index``, the step's place in its batch) when one has no strict JSON form."""
    blobs: Blobs = []
    try:
        cols, values = changes(step.before, step.record, blobs)
        history = [HISTORY.values(h) for h in step.history]
        attempt = None if step.attempt is None else ATTEMPT.values(step.attempt)
        outbox = None
        if step.outbox_done is not None:
            outbox = (dumps(step.outbox_done[1]), step.record.updated_at, step.outbox_done[0])
    except UNENCODABLE as exc:
        raise StepRejected(f"a step of instance {step.record.id} holds a value the store "
                           f"cannot encode as strict JSON at {culprit(step)}: "
                           f"{type(exc).__name__}: {exc}", index=index,
                           instance_id=step.record.id) from None
    return cols, values, history, attempt, outbox, blobs


def culprit(step: StepCommit) -> str:
    """Where in ``step`` the first unencodable value is (``history[0].detail.x`` …)."""
    parts: builtins.list[tuple[str, Any]] = [("context", step.record.context),
                                             ("visits", step.record.visits)]
    parts += [(f"history[{i}].{col}", getattr(h, col)) for i, h in enumerate(step.history)
              for col in ("guards", "delta", "detail")]
    if step.outbox_done is not None:
        parts.append(("outbox result", step.outbox_done[1]))
    for where, value in parts:
        items = value.items() if isinstance(value, dict) else enumerate(value or ())
        for key, item in items:
            try:
                dumps(item)
            except UNENCODABLE:
                return f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]"
    return "a column"
