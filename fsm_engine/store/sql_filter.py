"""One filter builder for both SQL backends: an :class:`~.records.InstanceFilter` as
``WHERE …`` text plus its arguments, in a :class:`Dialect`'s words.

The semantics are the same on every backend (the store contract's read cases check
them on both); what differs is only spelled here: placeholders (``?`` / ``%s``), how
a choice of values is written (``IN (?, …)`` / ``= ANY(%s)``), the case-insensitive
text match (SQLite's ``LIKE``, ASCII case-insensitive; PostgreSQL's ``ILIKE``), the
``ESCAPE`` clause (PostgreSQL's default escape is already ``\\``), and the test of
context values stored beside the row (``BESIDE_SQL`` of each backend's read module).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .records import InstanceFilter

__all__ = ["Dialect", "escape_like", "like_anywhere", "where_sql"]


@dataclass(frozen=True)
class Dialect:
    """How one backend spells the filter's parts."""

    mark: str            # the placeholder: "?" or "%s"
    escape: str          # appended to a LIKE: " ESCAPE '\\'" or ""
    text_like: str       # the case-insensitive match operator: "LIKE" or "ILIKE"
    beside_sql: str      # context values beside the row; two arguments (the pattern twice)
    any_array: bool      # True: ``= ANY(array)``; False: ``IN (?, …)``

    def any_of(self, column: str, values: tuple[str, ...]) -> tuple[str, list[Any]]:
        """``column`` is one of ``values`` (an empty choice matches nothing)."""
        if self.any_array:
            return f"{column} = ANY({self.mark})", [list(values)]
        if not values:
            return "0", []
        return f"{column} IN ({','.join([self.mark] * len(values))})", list(values)


def escape_like(text: str) -> str:
    """``text`` with LIKE's ``%``, ``_`` and ``\\`` escaped by ``\\`` (both backends)."""
    return re.sub(r"([\\%_])", r"\\\1", text)


def like_anywhere(text: str) -> str:
    """``text`` as a LIKE / ILIKE pattern matching it anywhere, taken literally."""
    return "%" + escape_like(text) + "%"


_TIMES = (("created_at", ">=", "created_after"), ("created_at", "<", "created_before"),
          ("updated_at", ">=", "updated_after"), ("updated_at", "<", "updated_before"))


def where_sql(d: Dialect, f: InstanceFilter, *, after_key: bool = False) -> tuple[str, list[Any]]:
    """`` WHERE …`` (or ``""``) and its arguments for filter ``f``; with ``after_key`` a
    leading ``key > ?`` is added for keyset paging (its argument comes first)."""
    clauses: list[str] = [f"key > {d.mark}"] if after_key else []
    args: list[Any] = []
    for column, value in (("machine", f.machine), ("forked_from", f.forked_from)):
        if value is not None:
            clauses.append(f"{column} = {d.mark}")
            args.append(value)
    for column, values in (("status", f.statuses), ("state", f.states), ("reason", f.reasons)):
        if values is not None:
            clause, more = d.any_of(column, values)
            clauses.append(clause)
            args.extend(more)
    if f.top_level:
        clauses.append("parent_id IS NULL")
    if f.family is not None:
        clauses.append(f"(id = {d.mark} OR id LIKE {d.mark}{d.escape})")
        args.extend([f.family, escape_like(f.family) + ".%"])
    if f.text:
        match = f"{d.text_like} {d.mark}{d.escape}"
        clauses.append(f"(id {match} OR context {match} OR last_error {match} OR {d.beside_sql})")
        args.extend([like_anywhere(f.text)] * 5)
    for column, op, name in _TIMES:
        bound = getattr(f, name)
        if bound is not None:
            clauses.append(f"{column} {op} {d.mark}")
            args.append(float(bound))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args
