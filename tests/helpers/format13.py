"""Turn a current store back into format 13's shape (before issue 38's start options), so a
migration test can open it as an older fsm_engine left it (without format 15's schedules
either): ``UNDO_14`` statements, ``{t}``
the schema prefix (``""`` for SQLite, ``"name."`` for a PostgreSQL schema)."""

from __future__ import annotations

UNDO_14 = (
    "DROP TABLE IF EXISTS {t}schedules",  # format 15's (a store of 13 has neither)
    *(f"DROP INDEX IF EXISTS {{t}}{name}" for name in (
        "idx_instances_start_key", "idx_instances_debounce", "idx_instances_rank")),
    *(f"ALTER TABLE {{t}}instances DROP COLUMN {col}" for col in (
        "start_key", "priority", "rank", "debounce_key", "debounce_until")),
)



#: SQLite's format 16/17 index of waiting instances (``schema.TIMERS_INDEX``): it covers
#: ``rank``, which format 14 added, so it goes first; a SQLite file of 13 has none.
#: (PostgreSQL's index of that name is its format 5's: kept.)
UNDO_16_SQLITE = ("DROP INDEX IF EXISTS idx_instances_timers",)


def undo_14(prefix: str = "") -> list[str]:
    """``UNDO_14`` for the schema ``prefix`` (``""``: SQLite, ``UNDO_16_SQLITE`` first)."""
    return [*(UNDO_16_SQLITE if not prefix else ()), *(sql.format(t=prefix) for sql in UNDO_14)]
