"""Streamed model replies in the store (format 12): the rows and the SQL every backend shares.

A step's streamed model call writes its text as it is generated to ``stream_rows``, an
append-only log per instance addressed ``(instance, pos)``: ``pos`` runs 0, 1, 2 … with no
gaps, so a reader in any process resumes exactly from a position.  Each row belongs to one
*attempt* of one step, ``(seq, attempt)``: ``seq`` is the history row the step will write,
``attempt`` counts the streamed calls of that step (1, 2 …: a retry, a re-ask after invalid
output, a new owner after a crash).  Kinds:

- ``open``        an attempt begins (``info.json``: the call asked for a JSON schema);
- ``chunk``       text; ``offset`` is its first character's index in the attempt's reply;
- ``end``         the attempt's reply is complete (``info.finish``, ``info.chars``);
- ``error``       the call failed after this text (``info.error``: the error class);
- ``superseded``  the attempt ``(seq, attempt)`` was replaced by ``info.by`` = ``[seq, attempt]``.

An attempt without an ``end`` row is not complete, whatever its text looks like (a crash
mid-stream leaves no ``end``).  These rows are not steps: ``runtime/ledger.py`` remains the
only writer of steps, and the history row keeps the whole reply; rows are pruned once their
step committed and the retention window passed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired

from pydantic import ConfigDict, Field, StrictInt, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # (pydantic reads typing.TypedDict from 3.12 on)

from ..errors import StoreError

__all__ = ["StreamRow", "StreamOp", "KINDS", "ROW_CHARS", "FENCED", "TABLE",
           "open_attempt", "append", "write", "decode", "READ", "PRUNE", "DELETE", "CHANNEL"]

KINDS = ("open", "chunk", "end", "error", "superseded")
#: Most characters of one chunk row: the pieces of one write are merged up to this.
ROW_CHARS = 8192
#: The PostgreSQL channel a stream write notifies (payload: the instance id).
CHANNEL = "fsm_stream"

#: The table (``{real}``: the backend's floating-point type).
TABLE = ("CREATE TABLE stream_rows (instance_id TEXT NOT NULL, pos BIGINT NOT NULL, "
         "seq BIGINT NOT NULL, attempt INTEGER NOT NULL, kind TEXT NOT NULL, "
         "char_offset BIGINT NOT NULL DEFAULT 0, text TEXT NOT NULL DEFAULT '', "
         "info TEXT NOT NULL DEFAULT '{{}}', at {real} NOT NULL, "
         "PRIMARY KEY (instance_id, pos))")
#: Statements (``?`` placeholders) both backends run.
NEXT_POS = ("SELECT COALESCE(MAX(pos), -1) + 1, (SELECT owner FROM instances WHERE id = ?) "
            "FROM stream_rows WHERE instance_id = ?")
#: The attempts opened or superseded of steps ``seq`` up to ``?`` and from ``?`` or whose
#: seq a ``recovery`` history row holds (their step never committed), and (kind ``''``, in
#: ``attempt``) the instance's next free position with its owner: what opening an attempt
#: reads, in one statement (one round trip less on PostgreSQL).
OPENED = ("SELECT seq, attempt, kind, NULL FROM stream_rows WHERE instance_id = ? "
          "AND kind IN ('open', 'superseded') AND seq <= ? AND (seq >= ? OR EXISTS ("
          "SELECT 1 FROM history h JOIN instances i ON i.key = h.instance "
          "WHERE i.id = stream_rows.instance_id AND h.seq = stream_rows.seq "
          "AND h.kind = 'recovery')) "
          "UNION ALL SELECT -1, COALESCE(MAX(pos), -1) + 1, '', "
          "(SELECT owner FROM instances WHERE id = ?) FROM stream_rows WHERE instance_id = ?")
INSERT = ("INSERT INTO stream_rows (instance_id, pos, seq, attempt, kind, char_offset, text, "
          "info, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
READ = ("SELECT instance_id, pos, seq, attempt, kind, char_offset, text, info, at "
        "FROM stream_rows WHERE instance_id = ? AND pos >= ? ORDER BY pos LIMIT ?")
#: Rows written before ``?`` (epoch s) whose step committed (or whose instance is gone).
PRUNE = ("DELETE FROM stream_rows WHERE at < ? AND seq <= COALESCE((SELECT i.seq FROM "
         "instances i WHERE i.id = stream_rows.instance_id), seq)")
DELETE = "DELETE FROM stream_rows WHERE instance_id IN ({marks})"

Execute = Callable[[str, Sequence[Any]], Sequence[Any]]


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One row of an instance's stream log (see the module docstring for ``kind``).

    ``pos``: its position in the instance's log (0-based; -1 before it is written);
    ``seq``/``attempt``: the step and attempt it belongs to; ``offset``: for a chunk, the
    index (characters) of its first character in the attempt's reply; ``at``: when it was
    written (epoch seconds).
    """

    instance_id: str
    seq: int
    attempt: int
    kind: str
    text: str = ""
    offset: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    pos: int = -1


_Natural = Annotated[StrictInt, Field(ge=0)]


@with_config(ConfigDict(extra="allow"))
class StreamInfo(TypedDict):
    """A row's stored ``info`` (the module doc's keys, written by its kind): a JSON object
    whose ``by``, when given, is ``[seq, attempt]`` (two integers >= 0); its other keys
    are kept as they are (their readers judge them, ``runtime.stream_read``)."""

    by: NotRequired[Annotated[list[_Natural], Field(min_length=2, max_length=2)] | None]


_INFO: TypeAdapter[StreamInfo] = TypeAdapter(StreamInfo)


@dataclass(frozen=True, slots=True)
class StreamOp:
    """One instance's part of a stream write (``Store.stream_write``): when ``open``, a new
    attempt of step ``seq`` begins first (superseding the open attempts of steps
    ``since``..``seq``; its ``open`` row carries ``info``, written at ``at``) and ``rows``
    get its number; then ``rows`` are appended to the instance's log.  ``owner``: the
    op applies only while its instance is held by that owner (``FENCED`` and nothing
    written otherwise: the rows of a worker that lost the instance to a takeover); None:
    unchecked (a step's own commit carries its rows, fenced by the step's version)."""

    instance_id: str
    rows: tuple[StreamRow, ...] = ()
    open: bool = False
    seq: int = 0
    since: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    owner: str | None = None


#: What ``write`` gives an op whose instance is not held by its ``owner`` (nothing written).
FENCED = -1


def write(execute: Execute, ops: Sequence[StreamOp]) -> list[int]:
    """In the caller's (serialised) transaction, each op in order: the attempt it opened
    (``open``), else the position of its first row; ``FENCED`` for an op whose ``owner``
    does not hold its instance (read by the statement that reads its positions, after the
    caller's lock).  Writers of one instance are serialised (SQLite's one writer,
    PostgreSQL's advisory lock), so a takeover's first ``open`` comes either before the
    check (which then fences) or after these rows (which it supersedes)."""
    return [open_attempt(execute, op.instance_id, op.seq, op.since, op.info, op.at, op.rows,
                         op.owner)
            if op.open else append(execute, op.instance_id, op.rows, op.owner) for op in ops]


#: A row's ``info`` as JSON (strict: no NaN); one encoder for all (``json.dumps`` with an
#: option builds one per call).
_info = json.JSONEncoder(allow_nan=False).encode

#: Rows one INSERT statement carries at most (9 parameters each: within SQLite's and
#: PostgreSQL's limits).
INSERT_ROWS = 500


def _insert(execute: Execute, rows: Sequence[StreamRow], start: int, attempt: int = 0) -> int:
    """Insert ``rows`` at positions ``start``, ``start + 1`` … (one statement per
    ``INSERT_ROWS``), a row of attempt 0 as of ``attempt``; the next free position."""
    for first in range(0, len(rows), INSERT_ROWS):
        part = rows[first:first + INSERT_ROWS]
        args: list[Any] = []
        for n, row in enumerate(part, start + first):
            args += [row.instance_id, n, row.seq, row.attempt or attempt, row.kind, row.offset,
                     row.text, _info(row.info) if row.info else "{}",
                     row.at]
        execute(INSERT + ", (?, ?, ?, ?, ?, ?, ?, ?, ?)" * (len(part) - 1), args)
    return start + len(rows)


def open_attempt(execute: Execute, instance_id: str, seq: int, since: int, info: dict[str, Any],
                 now: float, first: Sequence[StreamRow] = (), owner: str | None = None) -> int:
    """In the caller's (serialised) transaction: the new attempt's number (1 + the highest
    of step ``seq``), after a ``superseded`` row for each attempt not superseded yet of a
    step in ``[since, seq]`` or of an earlier one that never committed (a takeover's
    ``recovery`` history row holds its seq: however the takeover counted, mid-step or
    not), then the attempt's ``open`` row, then ``first``
    (rows of the attempt: those of attempt 0 are given its number here); ``FENCED``, and
    nothing written, when ``owner`` is given and does not hold the instance."""
    opened: dict[tuple[int, int], bool] = {}
    start = 0
    for row_seq, attempt, kind, held in execute(OPENED, [instance_id, seq, since, instance_id,
                                                         instance_id]):
        if not kind:
            if owner is not None and held != owner:
                return FENCED
            start = int(attempt)
            continue
        key = (int(row_seq), int(attempt))
        opened[key] = opened.get(key, False) or kind == "superseded"
    attempt = 1 + max((a for s, a in opened if s == seq), default=0)
    by = {"by": [seq, attempt]}
    rows = [StreamRow(instance_id, s, a, "superseded", info=by, at=now)
            for (s, a), done in sorted(opened.items()) if not done]
    rows.append(StreamRow(instance_id, seq, attempt, "open", info=info, at=now))
    rows += first
    _insert(execute, rows, start, attempt)
    return attempt


def append(execute: Execute, instance_id: str, rows: Sequence[StreamRow],
           owner: str | None = None) -> int:
    """In the caller's (serialised) transaction: ``rows`` (all of ``instance_id``) at the
    end of its log; the position of the first (the next free one when ``rows`` is empty);
    ``FENCED``, and nothing written, when ``owner`` is given and does not hold the
    instance."""
    [(start, held)] = execute(NEXT_POS, [instance_id, instance_id])
    if owner is not None and held != owner:
        return FENCED
    _insert(execute, rows, int(start))
    return int(start)


def decode(rows: Sequence[Sequence[Any]]) -> list[StreamRow]:
    """``READ``'s rows as ``StreamRow``s, up to the first malformed one (a position, seq,
    attempt or offset that is not an integer >= 0, an unknown kind, text that is not text,
    an ``info`` that is not a JSON object, a ``by`` that is not two integers, a time that is
    not a number); ``StoreError`` naming it when it comes first: a reader shows the rows
    before it, then reports it in one line (``fsm stream``) or one error event (the
    viewer) instead of failing half way."""
    out: list[StreamRow] = []
    for instance_id, pos, seq, attempt, kind, offset, text, info, at in rows:
        why = _malformed(pos, seq, attempt, kind, offset, text, at)
        parsed: Any = None
        if why is None:
            parsed, why = _read_info(info)
        if why is not None:
            if out:  # (the rows before it first: the next read begins at it)
                return out
            where = pos if _natural(pos) else repr(pos)[:30]
            raise StoreError(f"instance {instance_id}: stream row {where} is malformed: {why}")
        out.append(StreamRow(str(instance_id), seq, attempt, kind, text, offset, parsed,
                             float(at), pos))
    return out


def _natural(value: Any) -> bool:
    return type(value) is int and value >= 0


def _malformed(pos: Any, seq: Any, attempt: Any, kind: Any, offset: Any, text: Any,
               at: Any) -> str | None:
    """Why a row's columns are not a row (None: they are).  Columns, not stored JSON: the
    table types them and only SQLite's loose typing lets another tool write junk; checked
    by hand, one test per column, on every row a stream read or resume decodes."""
    for name, value in (("pos", pos), ("seq", seq), ("attempt", attempt),
                        ("char_offset", offset)):
        if not _natural(value):
            return f"{name} {repr(value)[:30]} is not an integer >= 0"
    if kind not in KINDS:
        return f"kind {repr(kind)[:30]} is not one of {', '.join(KINDS)}"
    if not isinstance(text, str):
        return f"text is {type(text).__name__}, not text"
    if type(at) not in (int, float) or not math.isfinite(at):
        return f"at {repr(at)[:30]} is not a time"
    return None


def _read_info(text: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A row's ``info`` read through ``StreamInfo``, or why it is not one."""
    try:
        return dict(_INFO.validate_json(text if isinstance(text, str) else "")), None
    except ValidationError as exc:
        if exc.errors()[0]["loc"][:1] != ("by",):
            return None, "info is not a JSON object"
    by = json.loads(text)["by"]  # (it parsed: only its by was refused; named whole)
    return None, f"by {json.dumps(by)[:30]} is not [seq, attempt]"
