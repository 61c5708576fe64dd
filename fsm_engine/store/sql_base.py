"""The store methods whose SQL is the same on every backend, written once.

``SqlPlain`` holds the plain facets' methods (named values, the fleet's limits, stored
definitions, schedules, a rate limit's settlement, a worker row's removal) over two primitives each
backend gives, in the SQL of ``?`` placeholders (PostgreSQL's turns them into ``%s``):

- ``_sql_rows(sql, args)``: all rows of one read, as plain tuples;
- ``_sql_write(*statements)``: ``(sql, args)`` pairs run in one transaction, their row
  counts in order; ``_sql_write_many(sql, rows)``: one statement over many argument rows,
  in one transaction.

Both raise ``StoreError`` (one line) as the backend's own calls do. A backend's methods with
SQL of its own (claims, commits, reads with dialect-specific filters) stay in its
subpackage; the filter SQL is shared through ``sql_filter``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import claims as claims_sql
from . import definitions as definitions_sql
from . import limits as limits_sql
from . import meta as meta_sql
from . import rates
from . import schedules as schedules_sql
from .records import DefinitionRow
from .schedules import ScheduleRow

__all__ = ["SqlPlain"]

Statement = tuple[str, Sequence[Any]]


class SqlPlain:
    """Mixed into ``SqliteStore`` and ``PostgresStore`` (after their own bases)."""

    def _sql_rows(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def _sql_write(self, *statements: Statement) -> list[int]:
        raise NotImplementedError

    def _sql_write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    # -- named values (``store.meta``) --------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._sql_rows(meta_sql.GET, (key,))
        return rows[0][0] if rows else None

    def meta_prefixed(self, prefix: str) -> dict[str, str]:
        return dict(self._sql_rows(meta_sql.PREFIX, meta_sql.prefix_bounds(prefix)))

    def put_meta(self, key: str, value: str | None) -> None:
        meta_sql.checked(key, value)
        self._sql_write((meta_sql.DROP, (key,)) if value is None
                        else (meta_sql.PUT, (key, value)))

    def add_meta(self, key: str, value: str) -> bool:
        meta_sql.checked(key, value)
        return self._sql_write((meta_sql.ADD, (key, value)))[0] == 1

    # -- the fleet's limits ---------------------------------------------------------------
    def get_limits(self) -> dict[str, Any] | None:
        return limits_sql.decode(self._sql_rows(limits_sql.GET))

    def put_limits(self, limits: dict[str, Any] | None) -> None:
        statements: list[Statement] = [(limits_sql.DROP, ())]
        if limits:
            statements.append((limits_sql.PUT, (limits_sql.encode(limits),)))
        self._sql_write(*statements)

    # -- stored definitions ---------------------------------------------------------------
    def put_definitions(self, rows: Sequence[DefinitionRow]) -> None:
        if rows:
            self._sql_write_many(definitions_sql.PUT, definitions_sql.encode_all(rows))

    def get_definition(self, machine: str, version: int,
                       fingerprint: str) -> DefinitionRow | None:
        return definitions_sql.decode(self._sql_rows(definitions_sql.GET,
                                                     (machine, version, fingerprint)))

    # -- schedules (``store.schedules``) ------------------------------------------------------
    def add_schedule(self, row: ScheduleRow) -> bool:
        return self._sql_write((schedules_sql.ADD, schedules_sql.encode(row)))[0] == 1

    def get_schedule(self, name: str) -> ScheduleRow | None:
        rows = self._sql_rows(schedules_sql.GET, (name,))
        return schedules_sql.decode(rows[0]) if rows else None

    def schedules(self) -> list[ScheduleRow]:
        return [schedules_sql.decode(r) for r in self._sql_rows(schedules_sql.ALL)]

    def due_schedules(self, now: float, limit: int) -> list[ScheduleRow]:
        return [schedules_sql.decode(r) for r in self._sql_rows(schedules_sql.DUE, (now, limit))]

    def next_schedule_fire(self) -> float | None:
        rows = self._sql_rows(schedules_sql.NEXT)
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def next_due(self, now: float, machines: Sequence[str] | None = None) -> float | None:
        sql, args = claims_sql.next_due(now, machines)
        rows = self._sql_rows(sql, args)
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def update_schedule(self, row: ScheduleRow, expected_version: int) -> bool:
        return self.update_schedules([(row, expected_version)])[0]

    def update_schedules(self, changes: Sequence[tuple[ScheduleRow, int]]) -> list[bool]:
        if not changes:
            return []
        counts = self._sql_write(*((schedules_sql.UPDATE, schedules_sql.update_args(row, v))
                                   for row, v in changes))
        for (row, version), n in zip(changes, counts, strict=True):
            if n == 1:
                row.version = version + 1
        return [n == 1 for n in counts]

    def delete_schedule(self, name: str) -> bool:
        return self._sql_write((schedules_sql.DELETE, (name,)))[0] == 1

    # -- rate limits, workers ---------------------------------------------------------------
    def rate_settle(self, name: str, key: str, tokens: int, until: float) -> None:
        self._sql_write((rates.SETTLE, (tokens, until, name, key)))

    def delete_worker(self, worker_id: str) -> None:
        self._sql_write(("DELETE FROM workers WHERE id=?", (worker_id,)))
