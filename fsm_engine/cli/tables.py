"""Instance tables for the terminal that never drop a column.

A table when every column fits the terminal with its full header; otherwise one
block per record (``label  value`` pairs, two per line when they fit).
``wide`` prints the table whatever the terminal's width.  Times are local
ISO-8601 with their age (``09:50:46 (5 min ago)``).  ``outcome`` adds a column of what each
instance came to (``outcome_cell``: the machine's ``outcome`` fields, else its state).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import FsmError
from ..terminal import console as safe_console
from ..terminal import shown
from ..views import shown_reason, shown_status, when

#: (header, min width, right-aligned) of the instance table.
COLUMNS = (("instance", 12, False), ("machine", 7, False), ("state", 5, False),
           ("status", 6, False), ("reason", 6, False), ("steps", 5, True),
           ("tokens", 6, True), ("created", 7, False), ("updated", 7, False),
           ("last error", 10, False))
#: The column ``print_records(outcome=...)`` adds.
OUTCOME = ("outcome", 7, False)
#: At most this many characters of one outcome value.
OUTCOME_VALUE_MAX = 60


def _at(context: Any, path: str) -> Any:
    """The value at a dotted ``path`` in ``context`` (None when a part is missing)."""
    value = context
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def outcome_cell(rec: Any, fields: Sequence[str]) -> str:
    """What ``rec`` came to: ``field=value`` for each of ``fields`` that holds a value
    (named by its last part: ``decision=approve, verdict_source=model``), else its state."""
    if isinstance(rec, FsmError):
        return ""
    parts = []
    for path in fields:
        value = _at(rec.context, path)
        if value is not None and value != "":
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            parts.append(f"{path.rpartition('.')[2]}={text[:OUTCOME_VALUE_MAX]}")
    return ", ".join(parts) or rec.state


def record_cells(rec: Any, live: set[str] | None, now: float) -> list[str]:
    """One instance (or the ``FsmError`` that stopped it) as cells in ``COLUMNS`` order."""
    if isinstance(rec, FsmError):
        cells = [rec.instance_id or "?", "", "", "error", "", "", "", "", "", str(rec)]
    else:
        status = shown_status(rec, live) if live is not None else rec.status
        cells = [rec.id, rec.machine, rec.state, status, shown_reason(rec, now),
                 str(rec.loop_count),
                 str(rec.tokens_used), when(rec.created_at, now), when(rec.updated_at, now),
                 (rec.last_error or "")[:200]]
    return [shown(c) for c in cells]  # stored text: never markup, never a control code


def _fits(width: int, skip: set[int], columns: Sequence[tuple[str, int, bool]]) -> bool:
    shown = [c for i, c in enumerate(columns) if i not in skip]
    # SIMPLE_HEAD box: one space of padding each side, no vertical rules
    return sum(max(len(h), m) for h, m, _ in shown) + 2 * len(shown) <= width


def _table(rows: list[list[str]], title: str, skip: set[int],
           columns: Sequence[tuple[str, int, bool]]) -> Table:
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for i, (header, minimum, right) in enumerate(columns):
        if i in skip:
            continue
        table.add_column(header, min_width=max(len(header), minimum if i == 0 else 0),
                         justify="right" if right else "left",
                         no_wrap=i == 0, overflow="fold")
    for row in rows:
        table.add_row(*(Text(c) for i, c in enumerate(row) if i not in skip))
    return table


def _blocks(console: Console, rows: list[list[str]], title: str, skip: set[int],
            columns: Sequence[tuple[str, int, bool]]) -> None:
    """One block per record: its id, then ``label value`` pairs, two a line when both fit."""
    console.print(Text(title, style="bold"))
    labels = [h for i, (h, _, _) in enumerate(columns) if i not in skip]
    pad = max(map(len, labels))
    half = max(20, (console.width - 4) // 2)
    for row in rows:
        cells = [c for i, c in enumerate(row) if i not in skip]
        console.print(Text(f"─ {labels[0]} {cells[0]}", style="bold"))
        items = [f"{label.ljust(pad)} {value or '-'}" for label, value in zip(labels[1:], cells[1:], strict=False)]
        i = 0
        while i < len(items):
            pair = items[i:i + 2]
            if len(pair) == 2 and max(map(len, pair)) <= half:
                console.print(Text(f"  {pair[0].ljust(half)}  {pair[1]}"))
                i += 2
            else:
                console.print(Text(f"  {items[i]}"))
                i += 1


def print_records(console: Console, records: Sequence[Any], *, title: str = "instances",
                  live: set[str] | None = None, wide: bool = False,
                  machine_column: bool | None = None,
                  outcome: Callable[[Any], str] | None = None) -> None:
    """Print ``records`` as a table or, on a terminal too narrow for every header, as blocks.

    ``machine_column`` None: shown when the records span several machines; ``outcome``:
    a last column, this function of each record (``outcome_cell``; stored text, shown safely).
    """
    now = time.time()
    machines = {r.machine for r in records if not isinstance(r, FsmError)}
    several = len(machines) > 1 if machine_column is None else machine_column
    skip = set() if several else {1}
    if not several and len(machines) == 1:
        title += f" of {shown(next(iter(machines)))}"
    rows = [record_cells(r, live, now) for r in records]
    columns: tuple[tuple[str, int, bool], ...] = COLUMNS
    if outcome is not None:
        columns += (OUTCOME,)
        for row, rec in zip(rows, records, strict=True):
            row.append(shown(outcome(rec)))
    if wide:
        console = safe_console(width=max(console.width, 250),
                               force_terminal=console.is_terminal, no_color=console.no_color,
                               file=console.file)
    if wide or _fits(console.width, skip, columns):
        console.print(_table(rows, title, skip, columns))
    else:
        _blocks(console, rows, title, skip, columns)
