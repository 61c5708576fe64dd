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



def undo_14(prefix: str = "") -> list[str]:
    """``UNDO_14`` for the schema ``prefix``."""
    return [sql.format(t=prefix) for sql in UNDO_14]
