"""``fsm fork``: new instances from a prefix of another's history (one or in bulk).

Registered on :data:`fsm_engine.cli.app` when ``cli`` is imported.
"""

from __future__ import annotations

import typer

from ..terminal import shown
from .common import DB, _fail, _find, _new_engine, _open, app
from .query import AS, BATCH, MACHINE, REASON, SINCE, STATUS, TEXT, UNTIL, YES
from .trust import MACHINES, trusting


@app.command()
def fork(instance_id: str | None = typer.Argument(None, help="Instance id (or a prefix); "
                                                     "omit with --status for a bulk fork."),
         db: str | None = DB,
         from_seq: int | None = typer.Option(None, "--from-seq", min=0,
                                                help="Copy history rows 1..N."),
         from_state: str | None = typer.Option(None, "--from-state",
                                                  help="Before the latest visit of this state "
                                                       "is left."),
         from_failure: bool = typer.Option(False, "--from-failure",
                                           help="Just before the last failure."),
         status: list[str] | None = typer.Option(None, "--status", help="Bulk: instances in "
                                                    "this status (repeatable; each forked from "
                                                    "its last failure, or --from-state)."),
         reason: str | None = typer.Option(None, "--reason", help="Bulk: with this reason."),
         machine: str | None = typer.Option(None, "--machine", help="Bulk: of this machine."),
         in_state: list[str] | None = typer.Option(None, "--in-state", metavar="STATE",
                                                   help="Bulk: standing in this state."),
         text: str | None = TEXT, since: str | None = SINCE, until: str | None = UNTIL,
         yes: bool = typer.Option(False, "--yes", help="Bulk: fork them (default: a dry run)."),
         batch: int = BATCH,
         reuse_llm: bool = typer.Option(False, "--reuse-llm/--fresh",
                                        help="Answer model calls whose prompt is byte-identical "
                                             "to one of the original's with its recorded reply "
                                             "(0 tokens), or call the model again (default)."),
         redeliver: bool = typer.Option(False, "--redeliver",
                                        help="Deliver again the side effects the original "
                                             "delivered (under the fork's own key)."),
         by: str | None = typer.Option(None, "--as", metavar="NAME",
                                       help="Who forks (default: $USER); kept in the fork's "
                                            "record (fork_options.by)."),
         machines: list[str] = MACHINES) -> None:
    """Fork an instance (the new one is runnable: `fsm resume` or a worker runs it); print the
    new id.  Side effects the original delivered are not repeated unless --redeliver."""
    from .console import operator
    dry = instance_id is None and not yes  # a dry run writes nothing, not even a definition
    engine = trusting(_new_engine(_open(db), keep_definitions=not dry), machines)
    try:
        if instance_id is None:
            from .console import _query, _where
            where = _where(machine, status, in_state, [reason] if reason else None, text,
                           since, until)
            if where is None:
                _fail("give an instance id, or a query (--status/--machine/…) to fork many")
            _query(engine, "fork", where, yes=yes, batch=batch, by=by, reason=None,
                   state=from_state, reuse_llm=reuse_llm, redeliver=redeliver)
            return
        if status or reason:
            _fail("--status/--reason select many instances: give no id with them")
        orig = _find(engine.store, instance_id)
        new = engine.fork(orig.id, from_seq=from_seq, from_state=from_state,
                          from_failure=from_failure, reuse_llm=reuse_llm, redeliver=redeliver,
                          by=operator(by))
        rec = engine.store.get(new)
        typer.echo(f"{new}: forked from {orig.id} at seq {rec.forked_at_seq}, "
                   f"in state {rec.state!r}")
    finally:
        engine.close()


@app.command()
def rerun(instance_id: str | None = typer.Argument(None, help="Instance id (or a prefix); "
                                                      "omit with a query to rerun many."),
          state: str = typer.Option(..., "--state", help="The state to run again."),
          in_place: bool = typer.Option(False, "--in-place",
                                        help="Reset this instance (appending to its history) "
                                             "instead of forking it."),
          machine: str | None = MACHINE, status: list[str] | None = STATUS,
          reason: list[str] | None = REASON, text: str | None = TEXT,
          since: str | None = SINCE, until: str | None = UNTIL, yes: bool = YES,
          batch: int = BATCH, db: str | None = DB, by: str | None = AS,
          machines: list[str] = MACHINES) -> None:
    """Force a state to run again (after its prompt or parameters changed): from just before
    its latest visit, as a fork by default; the instance is then runnable (`fsm resume`).
    With a query instead of an id: as forks of every match, a dry run unless --yes."""
    from .console import operator
    dry = instance_id is None and not yes  # a dry run writes nothing, not even a definition
    engine = trusting(_new_engine(_open(db), keep_definitions=not dry), machines)
    try:
        if instance_id is None:
            from .console import _query, _where
            where = _where(machine, status, None, reason, text, since, until)
            if where is None or in_place:
                _fail("give an instance id, or a query (--machine/--status/…) to rerun many "
                      "as forks (not --in-place)")
            _query(engine, "rerun", where, yes=yes, batch=batch, by=by, reason=None,
                   state=state)
            return
        orig = _find(engine.store, instance_id)
        new = engine.rerun(orig.id, state, in_place=in_place, by=operator(by))
        rec = engine.store.get(new)
    finally:
        engine.close()
    how = "reset in place" if in_place else f"forked from {orig.id}"
    typer.echo(f"{new}: {how}, in state {rec.state!r} ({rec.status})")


@app.command()
def replay(instance_id: str = typer.Argument(..., help="Instance id (or a prefix)."),
           module: str | None = typer.Argument(None, help="Machine module to replay "
                                                  "through (default: the instance's own, "
                                                  "when under the machines root)."),
           db: str | None = DB,
           as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")
           ) -> None:
    """Replay a stored instance through the current (or given) definition, in memory: no
    writes, no model calls, no side effects.  Exit 0 when it replays identically, 1 when
    it diverges."""
    from ..runtime.compiled import compile_machine
    from ..runtime.kinds.replay import replay as run_replay
    from ..runtime.loader import Trust, load_machine
    store = _open(db)
    try:
        rec = _find(store, instance_id)
        history, attempts = store.history(rec.id), store.attempts(rec.id)
    finally:
        store.close()
    if module is None:  # the row's own: imported only from under the machines root
        Trust().check(rec.module, rec.id)
    machine, _ = load_machine(module or rec.module, named=module is not None)
    report = run_replay(compile_machine(machine), rec, history, attempts)
    if as_json:
        from .common import _print_json
        _print_json(report.as_json())
    else:
        _print_replay(report)
    raise typer.Exit(0 if report.identical else 1)


def _print_replay(report: object) -> None:
    from ..runtime.kinds.replay import Replay
    assert isinstance(report, Replay)
    if report.identical:
        typer.echo(shown(f"{report.instance_id}: {report.steps} steps replay identically"))
        return
    for m in report.missing_states:
        typer.echo(shown(f"seq {m['seq']}: state {m['state']!r} no longer exists"))
    for g in report.guards:
        typer.echo(shown(f"seq {g['seq']}: guards were {g['recorded']}, now {g['now']}"))
    d = report.divergence
    if d is not None:
        now = " -> ".join(d["now"]) if d["now"] else "nothing"
        typer.echo(shown(f"seq {d['seq']}: from {d['source']!r} recorded "
                         f"{' -> '.join(d['recorded'])}, now {now} ({d['why']})"))
