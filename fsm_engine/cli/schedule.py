"""``fsm schedule add|list|pause|resume|delete|backfill``: schedules stored in the store and
fired by every ``fsm worker`` (``runtime.schedules``: one instance per tick across the
fleet).  Bad input — an unreadable cron expression or interval, an unknown zone, a module
that is no machine, an input that does not fit, an unknown or duplicate name — is one line
``fsm: error: …`` and exit 2, with nothing written.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from ..errors import InvalidInput
from ..terminal import shown
from ..views import when
from .common import DB, _input_for, _new_engine, _open, _print_json, app, out
from .trust import MACHINES, trusting

if TYPE_CHECKING:
    from ..runtime import Engine
    from ..store.schedules import ScheduleRow

schedule_app = typer.Typer(no_args_is_help=True,
                           help="Schedules: start a machine on a cron or an interval.")
app.add_typer(schedule_app, name="schedule")

NAME = typer.Argument(..., help="The schedule's name (letters, digits, _ . -).")


def _engine(db: str | None, *, create: bool = False, machines: list[str] | None = None
            ) -> Engine:
    return trusting(_new_engine(_open(db, create=create), llm=None), machines or [])


@schedule_app.command("add")
def add(name: str = NAME,
        module: str = typer.Argument(..., help="The machine's module (path or dotted name)."),
        cron: str | None = typer.Option(None, "--cron", metavar="EXPR",
                                        help="Cron: 5 fields, or 6 with seconds first."),
        every: str | None = typer.Option(None, "--every", metavar="DURATION",
                                         help="An interval: 2s, 500ms, 10m, 1h30m, 1d."),
        tz: str = typer.Option("UTC", "--tz", metavar="ZONE",
                               help="The IANA time zone cron fields are read in."),
        input: str | None = typer.Option(None, "--input", metavar="FILE",
                                         help="Each tick's input (a .json object file)."),
        overlap: str = typer.Option("skip", "--overlap", metavar="skip|queue|allow",
                                    help="A tick while the last instance runs: skip it, "
                                         "start it after, or start it anyway."),
        catchup: str = typer.Option("none", "--catchup", metavar="none|latest|all",
                                    help="Ticks missed while no worker ran: drop them, start "
                                         "the newest, or start each (at most 100)."),
        paused: bool = typer.Option(False, "--paused", help="Store it paused."),
        db: str | None = DB, as_json: bool = typer.Option(False, "--json")) -> None:
    """Store a schedule; every `fsm worker` of the store fires its ticks."""
    from ..runtime import load_machine
    from ..runtime.client import validate_input
    from ..runtime.compiled import compile_machine
    from ..runtime.schedules import checked
    checked(name, cron=cron, every=every, tz=tz, overlap=overlap, catchup=catchup)
    data = _input_for(input) if input else {}
    machine, ref = load_machine(module, named=True)
    compile_machine(machine)  # a broken module writes nothing
    validate_input(machine.context, data)  # nor an input that does not fit
    engine = _engine(db, create=True)
    try:
        if engine.store.get_schedule(name) is not None:  # before the definition is kept
            raise InvalidInput(f"schedule {name!r} exists (fsm schedule delete {name} first)")
        engine.register(machine, ref)
        row = engine.schedules.add(name, machine, cron=cron, every=every, tz=tz, input=data,
                                   overlap=overlap, catchup=catchup, paused=paused)
    finally:
        engine.close()
    if as_json:
        _print_json(_json(row, None))
    else:
        out.print(shown(f"schedule {row.name}: {_when(row)}; first tick "
                        f"{when(row.next_fire)}"))


@schedule_app.command("list")
def list_(db: str | None = DB,
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The schedules: when each ticks, its next and last tick, and the last one's instance."""
    store = _open(db)
    try:
        rows = store.schedules()
        status = {r.name: _status(store, r.last_instance) for r in rows}
    finally:
        store.close()
    if as_json:
        _print_json([_json(r, status[r.name]) for r in rows])
        return
    if not rows:
        out.print("no schedules (add one: fsm schedule add NAME MODULE --every 1h)")
        return
    table = Table(title="schedules")
    for col in ("name", "machine", "when", "next tick", "last tick", "last instance",
                "overlap/catchup", "skipped/missed"):
        table.add_column(col)
    now = time.time()
    for r in rows:
        last = "-" if r.last_instance is None else f"{r.last_instance} ({status[r.name]})"
        table.add_row(shown(r.name), shown(r.machine), shown(_when(r)),
                      "paused" if r.paused else when(r.next_fire, now),
                      when(r.last_fire, now), shown(last), f"{r.overlap}/{r.catchup}",
                      f"{r.skipped}/{r.missed}")
    out.print(table)


def _status(store: Any, iid: str | None) -> str | None:
    from ..errors import InstanceNotFound
    if iid is None:
        return None
    try:
        return str(store.get(iid).status)
    except InstanceNotFound:
        return "deleted"


def _when(row: ScheduleRow) -> str:
    every = f"every {row.every_s:g}s" if row.every_s is not None else f"cron {row.cron}"
    return every if row.tz == "UTC" else f"{every} ({row.tz})"


def _json(row: ScheduleRow, status: str | None) -> dict[str, Any]:
    from ..runtime.schedule_spec import iso
    return {"name": row.name, "machine": row.machine, "module": row.module, "cron": row.cron,
            "every_s": row.every_s, "tz": row.tz, "input": row.input, "overlap": row.overlap,
            "catchup": row.catchup, "paused": row.paused, "next_fire": iso(row.next_fire),
            "last_fire": iso(row.last_fire), "last_instance": row.last_instance,
            "last_status": status, "skipped": row.skipped, "missed": row.missed,
            "created_at": iso(row.created_at)}


def _change(name: str, db: str | None, action: str) -> None:
    engine = _engine(db)
    try:
        row = getattr(engine.schedules, action)(name)
    finally:
        engine.close()
    if action == "delete":
        out.print(shown(f"schedule {name} deleted (its instances stay)"))
    elif row.paused:
        out.print(shown(f"schedule {row.name} paused"))
    else:
        out.print(shown(f"schedule {row.name} active; next tick {when(row.next_fire)}"))


@schedule_app.command("pause")
def pause(name: str = NAME, db: str | None = DB) -> None:
    """Stop firing a schedule's ticks until `fsm schedule resume`."""
    _change(name, db, "pause")


@schedule_app.command("resume")
def resume(name: str = NAME, db: str | None = DB) -> None:
    """Fire a paused schedule again, from its next tick after now."""
    _change(name, db, "resume")


@schedule_app.command("delete")
def delete(name: str = NAME, db: str | None = DB) -> None:
    """Remove a schedule (the instances it started stay)."""
    _change(name, db, "delete")


@schedule_app.command("backfill")
def backfill(name: str = NAME,
             start: str = typer.Option(..., "--from", metavar="TIME",
                                       help="ISO 8601 (read in the schedule's zone without "
                                            "an offset)."),
             end: str = typer.Option(..., "--to", metavar="TIME", help="ISO 8601, not past now."),
             machines: list[str] = MACHINES, db: str | None = DB,
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Start one instance per tick of a past range (at most 1000); a tick that has its
    instance already is not started again."""
    from ..runtime.schedule_spec import iso, parse_time
    engine = _engine(db, machines=machines)
    try:
        row = engine.schedules.get(name)
        fired = engine.schedules.backfill(name, parse_time(start, row.tz),
                                          parse_time(end, row.tz))
    finally:
        engine.close()
    if as_json:
        _print_json([{"tick": iso(f.tick), "instance_id": f.instance_id, "new": f.new}
                     for f in fired])
        return
    for f in fired:
        out.print(shown(f"{iso(f.tick)} {f.instance_id} {'started' if f.new else 'existed'}"))
    out.print(f"{sum(f.new for f in fired)} started, {sum(not f.new for f in fired)} existed")
