"""``fsm list``, ``fsm history`` and ``fsm outbox``: reading instances from the terminal.

Registered on :data:`fsm_engine.cli.app` when ``cli`` is imported.  Tables keep
every column (``cli.tables``); times are local with their age.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from ..errors import InvalidInput
from ..store.records import STATUSES
from ..terminal import json_text, text
from ..views import history_json, instance_json, outbox_json
from .common import DB, _fail, _find, _live, _open, _print_json, app, out

if TYPE_CHECKING:
    from ..store import Store


def _when_arg(text: str | None) -> float | None:
    """``--since``/``--until``: an ISO date or time (local unless it names its offset) or an
    age such as ``2h`` or ``30d`` (that long ago), as epoch seconds."""
    if text is None:
        return None
    import datetime as _dt
    import time as _time

    from .observe import parse_age
    try:
        return _dt.datetime.fromisoformat(text).astimezone().timestamp()
    except ValueError:
        pass
    try:
        return _time.time() - parse_age(text)
    except InvalidInput:
        raise InvalidInput(f"cannot read time {text!r}: give an ISO date/time "
                           "(2026-12-01T09:30) or an age (2h, 30d)") from None


@app.command("list")
def list_(db: str = DB,
          status: list[str] | None = typer.Option(None, "--status", metavar="STATUS",
                                                     help="Only this status (repeatable; "
                                                          "'orphaned': its worker died)."),
          machine: str | None = typer.Option(None, "--machine", "-m", metavar="NAME",
                                                 help="Only this machine."),
          state: list[str] | None = typer.Option(None, "--state", metavar="STATE",
                                                    help="Only this state (repeatable)."),
          reason: list[str] | None = typer.Option(None, "--reason", metavar="REASON",
                                                     help="Only this failure reason (repeatable)."),
          text: str | None = typer.Option(None, "--text", "-t", metavar="TEXT",
                                             help="Only instances whose id, context or last "
                                                  "error contains this (case-insensitive)."),
          since: str | None = typer.Option(None, "--since", metavar="WHEN",
                                              help="Created at or after: ISO time or age (2h, 30d)."),
          until: str | None = typer.Option(None, "--until", metavar="WHEN",
                                              help="Created before: ISO time or age (2h, 30d)."),
          sort: str = typer.Option("created", "--sort", metavar="ORDER",
                                   help="created, updated, tokens, transitions or "
                                        "priority (claim order: highest first, then age)."),
          newest: bool = typer.Option(False, "--newest", help="Newest (or largest) first."),
          limit: int = typer.Option(100, "--limit", min=0, metavar="N", help="At most this many (0: all)."),
          offset: int = typer.Option(0, "--offset", min=0, metavar="N", help="Skip this many first (paging)."),
          wide: bool = typer.Option(False, "--wide", help="A table whatever the terminal's width."),
          forks_of: str | None = typer.Option(None, "--forks-of", metavar="ID",
                                                 help="Only the forks of this instance."),
          family: str | None = typer.Option(None, "--family", metavar="ID",
                                               help="Only this instance and its fan-out children."),
          children: bool = typer.Option(False, "--children",
                                        help="Also fan-out children (default: top-level only)."),
          as_json: bool = typer.Option(False, "--json", help="Print the records as JSON.")) -> None:
    """List instances (oldest first), with filters and paging."""
    from ..store.records import ORDERS, InstanceFilter
    from ..views import ORPHANED, shown_status
    wanted = list(status or ())
    for s in wanted:
        if s not in STATUSES and s != ORPHANED:
            _fail(f"unknown status {s!r}; one of: {', '.join((*STATUSES, ORPHANED))}")
    if sort not in ORDERS:
        _fail(f"unknown sort {sort!r}; one of: {', '.join(ORDERS)}")
    store = _open(db)
    parent = _find(store, forks_of).id if forks_of else None
    statuses = sorted({x for s in wanted for x in (("pending", "running") if s == ORPHANED else (s,))})
    where = InstanceFilter(machine=machine, statuses=tuple(statuses) if wanted else None,
                           states=tuple(state) if state else None,
                           reasons=tuple(reason) if reason else None, text=text,
                           created_after=_when_arg(since), created_before=_when_arg(until),
                           forked_from=parent,
                           top_level=not (children or family),
                           family=_find(store, family).id if family else None)
    live = _live(store)
    if ORPHANED in wanted:  # a derived status: narrowed here
        keep = set(wanted)
        records = [r for r in store.query(where, order=sort, descending=newest, limit=None)
                   if shown_status(r, live) in keep]
        total, records = len(records), records[offset:offset + limit if limit else None]
    else:
        total = store.count(where).get(None, 0)
        records = store.query(where, order=sort, descending=newest, limit=limit or None,
                              offset=offset)
    if as_json:
        _print_json([instance_json(r) | {"shown_status": shown_status(r, live)} for r in records])
    else:
        from .tables import print_records
        print_records(out, records, live=live, wide=wide)
    if len(records) < total:
        typer.echo(f"showing {offset + 1}–{offset + len(records)} of {total}; "
                   f"--offset {offset + len(records)} for more, --limit 0 for all", err=True)


def children_table(kids: list[Any]) -> Table:
    """The fan-out children of an instance: branch, state, status, reason, tokens."""
    table = Table(title=f"children ({len(kids)})", title_justify="left")
    for col in ("id", "branch", "machine", "state", "status", "reason", "tokens"):
        table.add_column(col, overflow="fold", justify="right" if col == "tokens" else "left")
    for k in kids:
        table.add_row(k.id, k.branch or "", k.machine, k.state, k.status, k.reason or "",
                      str(k.tokens_used))
    return table


def _history_table(rec: Any, rows: list[dict[str, Any]], title: bool = True) -> Table:
    """The rows as a table that fits ``out``: names whole when the other columns' longest
    words still fit beside them, else folded (rich crops a table whose columns' minimum
    widths exceed the terminal: the right-hand columns would vanish)."""
    names = {col: min(20, max([len(str(r[col])) for r in rows] + [len(col)]))
             for col in ("source", "dest", "trigger")}
    for keep in (names, {col: len(col) for col in names}, {}):  # then only headers whole
        table = _history_rows(rec, rows, title, keep)
        if table.__rich_measure__(out, out.options).minimum <= out.width:  # unclamped
            break
    return table


def _history_rows(rec: Any, rows: list[dict[str, Any]], title: bool,
                  names: dict[str, int]) -> Table:
    from ..views import agent_note, guard_reading, local_time, pause_note, recovery_note, timer_note
    table = Table(title=text(f"history of {rec.id}") if title else None, title_justify="left")
    for col in ("seq", "at", "source", "dest", "trigger", "guards", "ms", "tokens", "note"):
        fixed = col in ("seq", "at", "ms", "tokens")
        table.add_column(col, overflow="fold", no_wrap=fixed, min_width=names.get(col),
                         justify="right" if col in ("seq", "ms", "tokens") else "left")
    for r in rows:
        guards = ", ".join(f"{label} {'✓' if ok else '✗'}"
                           for label, ok in (guard_reading(str(g[0]), g[1]) for g in r["guards"]))
        table.add_row(str(r["seq"]), local_time(r["at"]), r["source"], r["dest"], r["trigger"],
                      guards, f"{r['duration_ms']:.1f}", str(r["tokens"]),
                      pause_note(r) or r["error"] or r["reason"] or timer_note(r)
                      or recovery_note(r["detail"]) or agent_note(r["detail"]) or "")
    return table


@app.command()
def history(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
            db: str = DB,
            follow: bool = typer.Option(False, "--follow", "-f",
                                        help="Keep printing new rows until the instance is final."),
            interval: float = typer.Option(0.5, "--interval", min=0.05,
                                           help="Seconds between polls with --follow."),
            as_json: bool = typer.Option(False, "--json",
                                         help="Print the rows as JSON (one line each with --follow).")) -> None:
    """Show an instance's audit history (every transition, with guards and tokens)."""
    store = _open(db)
    rec = _find(store, instance_id)
    rows = history_json(rec, store.history(rec.id))
    if not follow:
        if as_json:
            _print_json(rows)
        else:
            out.print(_history_table(rec, rows))
            kids = store.children(rec.id)
            if kids:
                out.print(children_table(kids))
        return
    _follow(store, rec, rows, as_json, interval)


def _follow(store: Store, rec: Any, rows: list[dict[str, Any]], as_json: bool,
            interval: float) -> None:
    """Print ``rows`` and every row committed after them until the instance is final."""
    import time as _time
    seen = 0
    try:
        while True:
            fresh = rows[seen:]
            if fresh:
                if as_json:
                    for r in fresh:
                        typer.echo(json_text(json.dumps(r, ensure_ascii=False)))
                else:
                    out.print(_history_table(rec, fresh, title=seen == 0))
                seen = len(rows)
            if rec.final:
                out.print(f"{rec.id}: {rec.status} in state {rec.state}", highlight=False)
                return
            _time.sleep(interval)
            rec = store.get(rec.id)
            rows = history_json(rec, store.history(rec.id))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
def outbox(db: str = DB,
           instance: str | None = typer.Option(None, "--instance",
                                                  help="Only this instance's rows (id or prefix)."),
           status: str | None = typer.Option(None, "--status", help="Only 'pending' or 'done' rows."),
           as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON.")) -> None:
    """List side-effect deliveries (idempotency keys and their status)."""
    if status is not None and status not in ("pending", "done"):
        _fail(f"unknown outbox status {status!r}; one of: pending, done")
    store = _open(db)
    iid = _find(store, instance).id if instance else None
    rows = [r for r in outbox_json(store.outbox(iid)) if status is None or r["status"] == status]
    if as_json:
        _print_json(rows)
        return
    from ..views import when
    table = Table(title="outbox", title_justify="left")
    for col in ("instance", "state", "idempotency key", "status", "attempts", "updated"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["instance_id"], r["state"], r["key"], r["status"], str(r["attempts"]),
                      when(r["updated_at"]))
    out.print(table)
