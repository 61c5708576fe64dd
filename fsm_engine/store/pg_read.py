"""The PostgreSQL store's read side: ``query``, ``count``, ``steps``, ``delete``, ``check``.

The same semantics as the SQLite read side (``sqlite_read``), in PostgreSQL's
dialect: ``%s`` placeholders, ``= ANY(array)`` for choices, ``ILIKE`` for the
case-insensitive text search, ``json`` operators on the JSON-as-text columns
(``json``, not ``jsonb``: a value is counted under its stored compact text, as
on SQLite).  A context field name is passed as a bound parameter after it has
been checked against ``context.IDENTIFIER``, so nothing a caller writes reaches
the SQL text.  Each read is one autocommit statement; under MVCC it neither
waits for writers nor makes them wait, and ``steps`` reads one batch of
instances per statement so no snapshot is held open while a caller iterates.
The functions take an open psycopg connection; ``PostgresStore`` runs them
under its lock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..errors import InvalidInput
from .codec import INSTANCE, SELECT_INSTANCES
from .records import GROUPS, ORDERS, InstanceFilter, InstanceRecord, StepRow
from .sql_filter import Dialect
from .sql_filter import where_sql as sql_where
from .sqlite_read import CHECKS, describe, ended_at

_ORDER_COLUMNS = {"created": "key", "updated": "updated_at", "tokens": "tokens_used",
                  "transitions": "loop_count", "priority": "rank"}
assert set(_ORDER_COLUMNS) == set(ORDERS)
_FIELD = re.compile(r"^context\.([A-Za-z_][A-Za-z0-9_]*)$")

#: A JSON number (or anything else) in ``detail`` as an integer, else NULL.
_INT = "CASE json_typeof(h.detail::json -> '{0}') WHEN 'number' THEN " \
       "trunc((h.detail::json ->> '{0}')::numeric)::bigint END"

#: History rows as ``StepRow`` columns (JSON payloads reduced to three numbers), then the
#: instance key (for keyset paging).
_STEPS = (
    "SELECT i.id, i.machine, i.status, i.created_at, h.seq, h.source, h.dest, h.trigger,"
    " h.kind, h.at, h.duration_ms,"
    f" h.tokens - COALESCE({_INT.format('children_tokens')}, 0), h.error, h.reason,"
    f" COALESCE({_INT.format('attempt')}, 1), COALESCE({_INT.format('reasks')}, 0),"
    " CASE json_typeof(h.detail::json -> 'llm_calls') WHEN 'array'"
    " THEN json_array_length(h.detail::json -> 'llm_calls') ELSE 0 END, h.instance"
    " FROM history h JOIN instances i ON i.key = h.instance"
    " WHERE i.key IN (SELECT key FROM instances{where} ORDER BY key LIMIT %s)"
    " ORDER BY h.instance, h.seq")

#: Indexes of this schema PostgreSQL marks invalid (a failed or interrupted build).
_INVALID_INDEXES = (
    "SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid"
    " JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace"
    " WHERE n.nspname = current_schema() AND NOT (x.indisvalid AND x.indisready)"
    " ORDER BY c.relname")
#: B-tree indexes of this schema, for ``amcheck`` when that extension is installed.
_BTREE_INDEXES = (
    "SELECT c.oid::regclass::text, c.oid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid"
    " JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace"
    " JOIN pg_am a ON a.oid = c.relam WHERE n.nspname = current_schema() AND a.amname = 'btree'"
    " AND x.indisvalid ORDER BY c.relname")
_AMCHECK = "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace" \
           " WHERE e.extname = 'amcheck'"


#: How long (seconds) the server lets one of our sessions sit idle inside a transaction
#: before it ends the session (``idle_in_transaction_session_timeout``). None of our
#: transactions waits on anything but the database between its statements, so a session
#: idle that long belongs to a stopped or stalled process (SIGSTOP, a swapped-out host):
#: its row locks would block every worker that takes its instances over, event loop and
#: all (matrix finding M4). Ended, its transaction rolls back and the stalled process
#: meets a dropped connection when it goes on (a ``StoreError``, recovered from like a
#: database restart). A URL's own ``options`` setting it win. The server does not arm
#: it after a pipeline (matrix finding M6): ``pg_fence`` covers that case.
IDLE_IN_TRANSACTION_S = 5.0


def session_options(dsn: str, *, readonly: bool = False) -> dict[str, str]:
    """``psycopg.connect`` keywords for every connection to ``dsn``: the URL's own
    ``options`` kept, ``idle_in_transaction_session_timeout`` (``IDLE_IN_TRANSACTION_S``)
    added unless they set it, and, ``readonly``, every transaction read-only
    (``default_transaction_read_only``)."""
    from psycopg.conninfo import conninfo_to_dict
    given = str(conninfo_to_dict(dsn).get("options") or "")
    extra = []
    if "idle_in_transaction_session_timeout" not in given:
        extra.append(f"-c idle_in_transaction_session_timeout="
                     f"{int(IDLE_IN_TRANSACTION_S * 1000)}")
    if readonly:
        extra.append("-c default_transaction_read_only=on")
    return {"options": " ".join([given, *extra]).strip()}


#: A text search's test of the context values stored beside the row (as on SQLite:
#: ``sqlite_read.BESIDE_SQL``; two arguments, the ILIKE pattern twice).
BESIDE_SQL = ("(EXISTS (SELECT 1 FROM blobs WHERE data ILIKE %s)"
              " AND context_refs <> '{}' AND EXISTS (SELECT 1 FROM"
              " json_each_text(context_refs::json) r WHERE left(r.key, 7) <> '$input.'"
              " AND r.value IN (SELECT hash FROM blobs WHERE data ILIKE %s)))")


POSTGRES = Dialect(mark="%s", escape="", text_like="ILIKE", beside_sql=BESIDE_SQL, any_array=True)


def where_sql(f: InstanceFilter, *, after_key: bool = False) -> tuple[str, list[Any]]:
    """`` WHERE …`` (or ``""``) and its arguments for filter ``f`` in PostgreSQL's words
    (:func:`.sql_filter.where_sql`)."""
    return sql_where(POSTGRES, f, after_key=after_key)


def query(conn: Any, f: InstanceFilter, order: str, descending: bool,
          limit: int | None, offset: int) -> list[InstanceRecord]:
    """``Store.query``: one page of matching instances; ``InvalidInput`` for an unknown order."""
    if order not in _ORDER_COLUMNS:
        raise InvalidInput(f"unknown order {order!r}; one of: {', '.join(ORDERS)}")
    where, args = where_sql(f)
    way = "DESC" if descending else "ASC"
    column = _ORDER_COLUMNS[order]
    sql = f"{SELECT_INSTANCES}{where} ORDER BY {column} {way}" + (
        f", key {way}" if column != "key" else "")
    if limit is not None or offset:
        sql += " LIMIT %s OFFSET %s"
        args += [None if limit is None else max(0, int(limit)), max(0, int(offset))]
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, args)
        return [INSTANCE.decode(row) for row in cur.fetchall()]


def count(conn: Any, f: InstanceFilter, by: str | None) -> dict[str | None, int]:
    """``Store.count``; ``InvalidInput`` for an unknown ``by`` (checked before any SQL)."""
    where, args = where_sql(f)
    pre: list[str]
    if by is None:
        sql, pre = f"SELECT NULL, COUNT(*) FROM instances{where}", []
    elif by in GROUPS:
        sql, pre = f"SELECT {by}, COUNT(*) FROM instances{where} GROUP BY 1", []
    else:
        match = _FIELD.match(by)
        if match is None:
            raise InvalidInput(f"cannot count by {by!r}; one of: {', '.join(GROUPS)}, "
                               "context.FIELD")
        # strings as themselves; any other JSON value as its JSON text; missing: NULL
        sql = ("SELECT CASE json_typeof(context::json -> %s) WHEN 'string'"
               " THEN context::json ->> %s ELSE (context::json -> %s)::text END,"
               f" COUNT(*) FROM instances{where} GROUP BY 1")
        pre = [match.group(1)] * 3
    with conn.cursor() as cur:
        cur.execute(sql, [*pre, *args])
        return {row[0]: row[1] for row in cur.fetchall() if row[1]}


def steps(run: Any, f: InstanceFilter, batch: int) -> Iterator[StepRow]:
    """``Store.steps``: ``run(sql, args)`` returns all rows of one statement; each call
    reads the history of the next ``batch`` matching instances (keyset paging)."""
    where, args = where_sql(f, after_key=True)
    sql = _STEPS.format(where=where)
    after = 0
    while True:
        rows = run(sql, [after, *args, max(1, int(batch))])
        if not rows:
            return
        for row in rows:
            yield StepRow(*row[:-1])
        after = rows[-1][-1]


def delete(conn: Any, instance_ids: Sequence[str], versions: Sequence[int] | None = None
           ) -> int:
    """``Store.delete`` inside the caller's transaction: history, attempts and outbox
    rows first, then the instances; returns how many instances were deleted (with
    ``versions``: only those still at them and ended, their rows locked first)."""
    ids = list(dict.fromkeys(instance_ids))
    if versions is not None:
        ids = ended_at(conn, instance_ids, versions, mark="%s", lock=" FOR UPDATE")
    if not ids:
        return 0
    with conn.cursor() as cur:
        cur.execute("DELETE FROM history WHERE instance IN "
                    "(SELECT key FROM instances WHERE id = ANY(%s))", (ids,))
        cur.execute("DELETE FROM attempts WHERE instance_id = ANY(%s)", (ids,))
        cur.execute("DELETE FROM outbox WHERE instance_id = ANY(%s)", (ids,))
        cur.execute("DELETE FROM review_items WHERE instance_id = ANY(%s)", (ids,))
        cur.execute("DELETE FROM stream_rows WHERE instance_id = ANY(%s)", (ids,))
        cur.execute("DELETE FROM instances WHERE id = ANY(%s)", (ids,))
        return int(cur.rowcount)


def check(conn: Any) -> list[str]:
    """``Store.check``: PostgreSQL has no whole-database integrity check, so this reports
    what the server can tell: indexes left invalid, B-tree index corruption when the
    ``amcheck`` extension is installed in the database (``bt_index_check``, a shared
    lock that does not block writers), then the store's invariants (as on SQLite)."""
    problems: list[str] = []
    with conn.cursor() as cur:
        cur.execute(_INVALID_INDEXES)
        problems += [f"index {row[0]} is invalid (rebuild it with REINDEX)"
                     for row in cur.fetchall()]
        cur.execute(_AMCHECK)
        found = cur.fetchone()
        if found is not None:
            schema = '"' + found[0].replace('"', '""') + '"'
            cur.execute(_BTREE_INDEXES)
            for name, oid in cur.fetchall():
                try:
                    with conn.transaction():
                        cur.execute(f"SELECT {schema}.bt_index_check(%s::oid)", (oid,))
                except psycopg.Error as exc:  # the finding itself
                    problems.append(f"amcheck: index {name}: {' '.join(str(exc).split())}")
        for name, sql in CHECKS:
            cur.execute(sql)
            problems += [describe(name, tuple(row)) for row in cur.fetchall()]
    return problems
