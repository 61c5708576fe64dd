"""``fsm migrate``: show, then apply, the upcasts of instances stored under older machine
versions (see ``fsm_engine.runtime.kinds.migrate_batch``).

Registered on :data:`fsm_engine.cli.app` when ``cli`` is imported.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

from ..terminal import shown as safe_text
from .common import DB, _new_engine, _open, _print_json, app
from .trust import MACHINES, trusting

if TYPE_CHECKING:
    from ..runtime.kinds.migrate_batch import Entry


def _diff_text(diff: dict[str, Any]) -> str:
    parts = []
    old, new = diff["state"]
    if old != new:
        parts.append(f"state {old} -> {new}")
    parts += [f"+{k}={json.dumps(v)}" for k, v in diff["added"].items()]
    parts += [f"~{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in diff["changed"].items()]
    parts += [f"-{k}" for k in diff["removed"]]
    return ", ".join(parts) or "no context change"


def _line(e: Entry, yes: bool) -> str:
    from ..runtime.kinds.migrate_batch import MIGRATE
    head = f"{e.id} {e.machine} v{e.from_version} -> v{e.to_version}"
    if e.outcome == MIGRATE:
        verb = ("migrated" if e.applied else "changed meanwhile, left") if yes else "would migrate"
        return f"{head}: {verb}: {_diff_text(e.diff or {})}"
    return f"{head}: {e.outcome.replace('_', ' ')}: {e.cause}"


@app.command()
def migrate(db: str | None = DB,
            machine: str | None = typer.Option(None, "--machine",
                                                  help="Only instances of this machine."),
            dry_run: bool = typer.Option(True, "--dry-run/--yes",
                                         help="Show what would change (default), or apply it."),
            batch: int = typer.Option(100, "--batch", min=1,
                                      help="Instances per transaction with --yes."),
            as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
            machines: list[str] = MACHINES) -> None:
    """Upcast unfinished instances stored under an older machine version: per instance the
    version change and the context diff, and those that cannot be migrated (their rows
    stay; --yes marks them reason needs_migration).  Exit 1 when any cannot be migrated;
    exit 2, nothing imported or written, when one names a machine module neither under the
    machines root nor given with --machines."""
    from ..runtime.kinds.migrate_batch import CURRENT, MIGRATE, NEEDS, apply, survey
    engine = trusting(_new_engine(_open(db), keep_definitions=not dry_run), machines)
    try:
        entries = survey(engine, machine)
        if not dry_run:
            apply(engine, entries, batch=batch)
    finally:
        engine.close()
    shown = [e for e in entries if e.outcome != CURRENT]
    if as_json:
        _print_json({"applied": not dry_run, "instances": [e.as_json() for e in shown],
                     "current": len(entries) - len(shown)})
    else:
        for e in shown:
            typer.echo(safe_text(_line(e, not dry_run)))
        todo = sum(e.outcome == MIGRATE for e in shown)
        done = sum(e.applied and e.outcome == MIGRATE for e in shown)
        tail = f"{done} migrated" if not dry_run else f"{todo} to migrate (--yes applies)"
        typer.echo(f"{tail}, {len(shown) - todo} cannot be now, "
                   f"{len(entries) - len(shown)} current")
    raise typer.Exit(1 if any(e.outcome == NEEDS for e in shown) else 0)
