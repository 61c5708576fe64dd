"""The SQLite store's read side: filtered, sorted, paged queries and statistics rows in SQL.

Everything here is plain SQL text plus its arguments, built from an
:class:`~.records.InstanceFilter`; :class:`~.sqlite.SqliteStore` runs it.
Each query is one statement (an autocommit read: in WAL mode it never blocks
a writer and is never blocked by one).  ``machine`` and ``status`` filters
use the ``(machine, status)`` index; the default order (creation) is the
primary key, so a first page of the newest instances reads only that page.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidInput
from .records import FINAL_STATUSES, GROUPS, ORDERS, InstanceFilter
from .sql_filter import Dialect
from .sql_filter import where_sql as sql_where

_ORDER_COLUMNS = {"created": "key", "updated": "updated_at", "tokens": "tokens_used",
                  "transitions": "loop_count", "priority": "rank"}
assert set(_ORDER_COLUMNS) == set(ORDERS)
_FIELD = re.compile(r"^context\.([A-Za-z_][A-Za-z0-9_]*)$")

#: History rows as ``StepRow`` columns (JSON payloads reduced to three numbers), then the
#: instance key (for keyset paging).
STEPS_SQL = (
    "SELECT i.id AS instance_id, i.machine, i.status, i.created_at, h.seq, h.source, h.dest, h.trigger,"
    " h.kind, h.at, h.duration_ms,"
    " h.tokens - COALESCE(json_extract(h.detail, '$.children_tokens'), 0) AS tokens,"
    " h.error, h.reason,"
    " COALESCE(json_extract(h.detail, '$.attempt'), 1) AS attempt,"
    " COALESCE(json_extract(h.detail, '$.reasks'), 0) AS reasks,"
    " COALESCE(json_array_length(h.detail, '$.llm_calls'), 0) AS llm_calls, h.instance"
    " FROM history h JOIN instances i ON i.key = h.instance"
    " WHERE i.key IN (SELECT key FROM instances {where} ORDER BY key LIMIT ?)"
    " ORDER BY h.instance, h.seq")


#: A text search's test of the context values stored beside the row (``context_refs``,
#: not the ``$input.`` ones; two arguments: the LIKE pattern twice).  Whether any blob
#: matches, and which, is found once per query (uncorrelated subqueries); only when one
#: does, rows holding refs look theirs up.
BESIDE_SQL = ("(EXISTS (SELECT 1 FROM blobs WHERE data LIKE ? ESCAPE '\\')"
              " AND context_refs != '{}' AND EXISTS (SELECT 1 FROM json_each(context_refs) r"
              " WHERE substr(r.key, 1, 7) != '$input.' AND r.value IN"
              " (SELECT hash FROM blobs WHERE data LIKE ? ESCAPE '\\')))")


SQLITE = Dialect(mark="?", escape=" ESCAPE '\\'", text_like="LIKE", beside_sql=BESIDE_SQL,
                 any_array=False)


def where_sql(f: InstanceFilter, *, after_key: bool = False) -> tuple[str, list[Any]]:
    """``WHERE …`` (or ``""``) and its arguments for filter ``f`` in SQLite's words
    (:func:`.sql_filter.where_sql`)."""
    return sql_where(SQLITE, f, after_key=after_key)


def query_sql(select: str, f: InstanceFilter, order: str, descending: bool,
              limit: int | None, offset: int) -> tuple[str, list[Any]]:
    """``select`` + filter + ``ORDER BY`` + paging; ``InvalidInput`` for an unknown order."""
    if order not in _ORDER_COLUMNS:
        raise InvalidInput(f"unknown order {order!r}; one of: {', '.join(ORDERS)}")
    where, args = where_sql(f)
    way = "DESC" if descending else "ASC"
    column = _ORDER_COLUMNS[order]
    sql = f"{select}{where} ORDER BY {column} {way}" + (f", key {way}" if column != "key" else "")
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        args += [-1 if limit is None else max(0, int(limit)), max(0, int(offset))]
    return sql, args


def count_sql(f: InstanceFilter, by: str | None) -> tuple[str, list[Any]]:
    """``SELECT group, COUNT(*)`` for ``Store.count``; ``InvalidInput`` for an unknown ``by``."""
    where, args = where_sql(f)
    if by is None:
        return f"SELECT NULL, COUNT(*) FROM instances{where}", args
    if by in GROUPS:
        column = by
    else:
        match = _FIELD.match(by)
        if match is None:
            raise InvalidInput(f"cannot count by {by!r}; one of: {', '.join(GROUPS)}, "
                               "context.FIELD")
        path = f"'$.{match.group(1)}'"
        # strings as themselves; any other JSON value as its JSON text; missing: NULL
        column = (f"CASE json_type(context, {path}) WHEN 'text' THEN context ->> {path}"
                  f" ELSE context -> {path} END")
    return f"SELECT {column} AS g, COUNT(*) FROM instances{where} GROUP BY g", args


def steps_sql(f: InstanceFilter) -> tuple[str, list[Any]]:
    """History rows of the next batch of matching instances after a key; the arguments
    returned are the filter's: the caller puts the key before and the batch size after."""
    where, args = where_sql(f, after_key=True)
    return STEPS_SQL.format(where=where), args


#: The invariants ``Store.check`` verifies besides ``PRAGMA integrity_check``.
CHECKS = (
    ("history seq gap", "SELECT i.id, i.seq, COUNT(h.seq), COALESCE(MAX(h.seq), 0),"
     " COALESCE(MIN(h.seq), 1) FROM instances i LEFT JOIN history h ON h.instance = i.key"
     " GROUP BY i.key HAVING COUNT(h.seq) != i.seq OR COALESCE(MAX(h.seq), 0) != i.seq"
     " OR COALESCE(MIN(h.seq), 1) != 1"),
    ("state mismatch", "SELECT i.id, i.state, h.dest FROM instances i JOIN history h"
     " ON h.instance = i.key AND h.seq = (SELECT MAX(seq) FROM history WHERE instance = i.key)"
     " WHERE h.dest != i.state"),
    ("orphan history", "SELECT h.instance, COUNT(*) FROM history h LEFT JOIN instances i"
     " ON i.key = h.instance WHERE i.key IS NULL GROUP BY h.instance"),
    ("orphan attempts", "SELECT a.instance_id, COUNT(*) FROM attempts a LEFT JOIN instances i"
     " ON i.id = a.instance_id WHERE i.id IS NULL GROUP BY a.instance_id"),
    ("orphan outbox", "SELECT o.instance_id, COUNT(*) FROM outbox o LEFT JOIN instances i"
     " ON i.id = o.instance_id WHERE i.id IS NULL GROUP BY o.instance_id"),
)


def describe(check: str, row: tuple[Any, ...]) -> str:
    """One line for one invariant violation found by a ``CHECKS`` query."""
    if check == "history seq gap":
        iid, seq, n, top, low = row
        return (f"instance {iid}: history seq not 1..{seq} without gaps "
                f"({n} rows, seq {low}..{top})")
    if check == "state mismatch":
        return f"instance {row[0]}: state {row[1]!r} but its last history row went to {row[2]!r}"
    if check == "orphan history":
        return f"{row[1]} history row(s) of missing instance key {row[0]}"
    return f"{row[1]} {check.split()[1]} row(s) of missing instance {row[0]}"


def ended_at(conn: Any, instance_ids: Sequence[str], versions: Sequence[int], *,
             mark: str = "?", lock: str = "") -> list[str]:
    """Of ``instance_ids``, those still at their ``versions`` and ended (completed, failed,
    cancelled), read in the caller's transaction (``Store.delete``'s compare-and-set; the
    same on both backends: ``conn.execute`` returns what ``fetchall`` reads; ``mark``: the
    placeholder, ``lock``: e.g. `` FOR UPDATE``).  ``ValueError`` when the two lengths
    differ."""
    wanted = dict(zip(instance_ids, versions, strict=True))
    found: list[str] = []
    ids = list(wanted)
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        rows = conn.execute(f"SELECT id, version, status FROM instances WHERE id IN "
                            f"({', '.join([mark] * len(chunk))}){lock}", chunk).fetchall()
        found += [iid for iid, version, status in rows
                  if version == wanted[iid] and status in FINAL_STATUSES]
    return found
