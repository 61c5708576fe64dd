"""``fsm stats``, ``fsm ui``, ``fsm prune`` and ``fsm check``: the operator's commands.

Registered on :data:`fsm_engine.cli.app` when ``cli`` is imported; each imports
what it needs when it runs, so ``fsm --help`` stays light.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from typing import Any

import typer
from rich.table import Table

from ..durations import parse_duration
from ..store.records import STATUSES, InstanceFilter
from ..terminal import shown, text
from .common import ALLOWED_HOST, DB, _fail, _open, _print_json, app, out
from .trust import MACHINES, trusting


def parse_age(text: str) -> float:
    """A duration as seconds (``durations``: ``30d``, ``12h``, ``90m``, ``45s``, ``2w``,
    ``1h30m``); ``InvalidInput`` otherwise."""
    from ..errors import InvalidInput
    seconds = parse_duration(text)
    if seconds is None and str(text).strip().startswith("-"):
        raise InvalidInput(f"a duration is not negative: {str(text)[:40]!r}")
    if seconds is None:
        raise InvalidInput(f"cannot read duration {str(text)[:40]!r}: use numbers with units "
                           "ms, s, m, h, d or w (e.g. 30d, 1h30m)")
    return seconds


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _triple(dist: Any, digits: int = 0) -> str:
    """``p50/p95/max`` of a ``Dist``."""
    if not dist.n:
        return "-"
    return "/".join(_fmt(v, digits) for v in (dist.p50, dist.p95, dist.max))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k or '(none)'} {v}" for k, v in counts.items()) or "-"


def _print_stats(stats: Any) -> None:
    out.print(text(stats.machine, "bold") + text(f": {stats.instances} instance(s)"))
    lines = [("status", _counts(stats.by_status)), ("reason", _counts(stats.by_reason)),
             ("fallback rate", _rate(stats.fallback_rate)), ("re-ask rate", _rate(stats.reask_rate)),
             ("tokens/instance p50/p95/max", _triple(stats.tokens)),
             ("wall s/instance p50/p95/max", _triple(stats.wall_s, 2))]
    lines += [(f"{field} values", _counts(values)) for field, values in stats.sources.items()]
    for key, value in lines:
        out.print(text(f"  {key}: {value}"))
    counts = Table(title=text(f"states of {stats.machine}"), title_justify="left")
    taken = any(st.recoveries for st in stats.states.values())  # a column only when any
    for col in ("state", "now", "entered", "steps", "retries", "fallbacks", "re-asks", "errors",
                *(("takeovers",) if taken else ())):
        counts.add_column(col, justify="left" if col == "state" else "right", overflow="fold")
    for st in stats.states.values():
        values = (st.now, st.entered, st.steps, st.retries, st.fallbacks, st.reasks, st.errors,
                  *((st.recoveries,) if taken else ()))
        counts.add_row(st.state, *(str(v) for v in values))
    out.print(counts)
    spread = Table(title=text(f"per step of {stats.machine}"), title_justify="left")
    for col in ("state", "figure", "p50", "p95", "max", "mean"):
        spread.add_column(col, justify="left" if col in ("state", "figure") else "right",
                          overflow="fold")
    for st in stats.states.values():
        if not st.steps:
            continue
        for i, (name, dist, digits) in enumerate((("tokens", st.tokens, 0),
                                                  ("action ms", st.action_ms, 1),
                                                  ("wall s", st.wall_s, 2))):
            spread.add_row(st.state if i == 0 else "", name,
                           *(_fmt(v, digits) for v in (dist.p50, dist.p95, dist.max, dist.mean)),
                           end_section=i == 2)
    out.print(spread)
    if stats.tools:
        _print_tools(stats)


def _print_tools(stats: Any) -> None:
    """An agent's tools: calls, error results, call duration (ms) p50/p95."""
    tools = Table(title=text(f"tools of {stats.machine}"), title_justify="left")
    for col in ("tool", "calls", "errors", "p50 ms", "p95 ms"):
        tools.add_column(col, justify="left" if col == "tool" else "right", overflow="fold")
    for t in stats.tools.values():
        tools.add_row(text(t.tool), str(t.calls), str(t.errors), _fmt(t.duration_ms.p50, 1),
                      _fmt(t.duration_ms.p95, 1))
    out.print(tools)


@app.command()
def stats(db: str = DB,
          machine: str | None = typer.Option(None, "--machine", "-m",
                                                help="Only this machine's instances."),
          status: list[str] | None = typer.Option(None, "--status",
                                                     help="Only instances in this status (repeatable)."),
          as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON.")) -> None:
    """Counts by status, state and reason; tokens and time per state (p50/p95/max);
    fallback and re-ask rates; the values of context fields named *_source."""
    from ..stats import machine_stats
    for s in status or ():
        if s not in STATUSES:
            _fail(f"unknown status {s!r}; one of: {', '.join(STATUSES)}")
    store = _open(db)
    where = InstanceFilter(machine=machine, statuses=tuple(status) if status else None)
    figures = machine_stats(store, where)
    if as_json:
        _print_json({name: s.to_json() for name, s in figures.items()})
        return
    if not figures:
        out.print(text("no instances" + (f" of machine {machine!r}" if machine else "")))
        return
    for figure in figures.values():
        _print_stats(figure)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@app.command()
def ui(db: str = DB,
       port: int = typer.Option(8765, "--port", min=0, max=65535,
                                help="TCP port (0: any free port, printed)."),
       host: str = typer.Option("127.0.0.1", "--host",
                                help="Address to bind; anything but loopback needs --token."),
       token: str | None = typer.Option(None, "--token", envvar="FSM_UI_TOKEN",
                                           help="Require this bearer token (or ?token=) on "
                                                "every request (or FSM_UI_TOKEN)."),
       refresh: int = typer.Option(3, "--refresh", min=0,
                                   help="Seconds between reloads of pages showing running "
                                        "instances (0: never)."),
       allowed_host: list[str] | None = ALLOWED_HOST,
       write: bool = typer.Option(False, "--write",
                                  help="The console: actions (pause, cancel, send, decide …) "
                                       "behind the token, which it requires."),
       machines: list[str] = MACHINES) -> None:
    """Serve a read-only web viewer of the database (instances, diagrams, statistics);
    with --write, the operator console."""
    if token is not None and any(c.isspace() or not c.isprintable() for c in token):
        _fail("--token (or FSM_UI_TOKEN) holds spaces or control characters: a bearer token "
              "is one word of printable characters")
    if write and not token:
        _fail("--write needs --token (or FSM_UI_TOKEN), also on loopback")
    if not _loopback(host) and not token:
        _fail(f"--host {host} exposes the viewer beyond this machine: give --token too")
    if token is not None and len(token) < 8:
        _fail("--token must be at least 8 characters")
    try:
        from ..ui.server import serve
    except ImportError as exc:
        _fail(f"the viewer needs the [ui] extra (pip install 'fsm_engine[ui]'): {exc}")
    engine = None
    if write:
        from ..runtime import Engine
        engine = trusting(Engine(_open(db), llm=None), machines)
    serve(db, host=host, port=port, token=token, refresh_s=refresh,
          allowed_hosts=tuple(allowed_host or ()), engine=engine)


@app.command()
def prune(db: str = DB,
          older_than: str = typer.Option(..., "--older-than",
                                         help="Finished (last updated) longer ago than this: 30d, 12h, 90m."),
          status: list[str] | None = typer.Option(None, "--status",
                                                     help="Only this final status (repeatable; "
                                                          "default: completed, failed, cancelled)."),
          yes: bool = typer.Option(False, "--yes", help="Delete (without it: a dry run that "
                                                        "only counts)."),
          batch: int = typer.Option(500, "--batch", min=1, max=100_000,
                                    help="Instances deleted per transaction."),
          as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON.")) -> None:
    """Delete old finished instances with their history, attempts and outbox rows (through
    the engine: each only while it is still finished at the version read; one restarted
    meanwhile is skipped and counted)."""
    from ..errors import InvalidInput
    from ..runtime import Engine
    where = InstanceFilter(statuses=tuple(status) if status else None,
                           updated_before=time.time() - parse_age(older_than))
    engine = Engine(_open(db), llm=None)
    try:
        done = engine.prune(where, batch=batch, dry_run=not yes)
    except InvalidInput as exc:
        _fail(str(exc))
    finally:
        engine.close()
    if as_json:
        _print_json({"matching": done.matching, "deleted": done.deleted,
                     "skipped": done.skipped, "dry_run": not yes})
    elif yes:
        out.print(f"deleted {done.deleted} instance(s) with their history, attempts and "
                  f"outbox rows" + (f"; {done.skipped} skipped (moved on since read)"
                                    if done.skipped else ""))
    else:
        out.print(f"would delete {done.matching} instance(s) (dry run; add --yes to delete)")


@app.command()
def check(db: str = DB,
          as_json: bool = typer.Option(False, "--json", help="Print the problems as JSON.")) -> None:
    """Check the database: the backend's own checks (SQLite's integrity check; on
    PostgreSQL invalid indexes, and amcheck when installed) and the store's invariants
    (history seq without gaps, each instance's state equals its last history row's
    destination, no rows of missing instances), then the runtime's: no fan-out child
    started twice, no parent waiting on children all final, no wait nothing can end
    (an approval or a review with no open item of its own), no outbox key delivered
    twice, every history replaying to its row (``runtime.invariants``).  Exit 1 when a
    problem is found."""
    from ..runtime.invariants import check as runtime_checks
    store = _open(db)
    problems = store.check() + runtime_checks(store)
    if as_json:
        _print_json({"ok": not problems, "problems": problems})
    elif problems:
        for p in problems:
            typer.echo(shown(p))
        typer.echo(f"{len(problems)} problem(s) found", err=True)
    else:
        out.print("ok: no problems found")
    raise typer.Exit(1 if problems else 0)


def viewer_hint(db: str | None) -> str:
    """The line ``fsm run`` ends with: the command that opens the viewer on its store,
    e.g. ``view: fsm ui --db fsm.db`` (``db`` as given, else ``$FSM_DB``, else ``fsm.db``;
    shell-quoted; a URL's password left out: libpq takes it from ``PGPASSWORD`` or
    ``~/.pgpass``)."""
    import shlex

    from ..redaction import redact
    from ..store import is_postgres, store_url
    url = store_url(db)
    if is_postgres(url):
        url = redact(url)
    return f"view: {_fsm_command()} ui --db {shlex.quote(url)}"


def _fsm_command() -> str:
    """How to call this ``fsm`` again from the current directory: ``fsm`` when that name
    on ``PATH`` is this program, else its path (e.g. ``.venv/bin/fsm`` of a venv that was
    not activated, or ``python -m fsm_engine.cli``)."""
    import shlex
    import shutil
    me = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not me or me.endswith(".py") or not os.path.isfile(me):
        return f"{shlex.quote(sys.executable)} -m fsm_engine.cli"
    found = shutil.which("fsm")
    if found and os.path.realpath(found) == os.path.realpath(me):
        return "fsm"
    rel = os.path.relpath(me)
    return shlex.quote(rel if not rel.startswith("..") else me)
