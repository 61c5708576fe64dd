"""``fsm cancel``, ``fsm pause``, ``fsm unpause`` (one id, several, or every instance a
query matches) and ``fsm send``: the operator's writes from the terminal (issue 25).

A query takes ``fsm list``'s filters (``--machine --status --state --reason --text
--since --until``) and is a dry run printing the count and a sample unless ``--yes``;
applied in batches, one transaction each (``runtime.bulk``).  Every history row written
names the operator (``--as``, default ``$USER``) in ``detail.operator``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import typer

from ..terminal import shown
from .common import DB, _fail, _find, _new_engine, _open, app, out
from .query import (  # the options ``fsm fork`` and ``fsm rerun`` share
    AS,
    BATCH,
    CHILDREN,
    IDS,
    MACHINE,
    REASON,
    SINCE,
    STATE,
    STATUS,
    TEXT,
    UNTIL,
    YES,
)
from .trust import MACHINES, trusting

if TYPE_CHECKING:
    from ..runtime import Engine


def operator(name: str | None) -> str:
    """The operator a row names: ``--as``, else ``$USER``, else ``operator``."""
    who = name or os.environ.get("USER") or "operator"
    return who[:200]


def _where(machine: str | None, status: list[str] | None, state: list[str] | None,
           reason: list[str] | None, text: str | None, since: str | None,
           until: str | None, children: bool = False) -> Any:
    """``fsm list``'s filters as an ``InstanceFilter`` (None: no filter given); like
    ``fsm list``, top-level instances only unless ``children``."""
    from ..store.records import STATUSES, InstanceFilter
    from .inspect import _when_arg
    for s in status or ():
        if s not in STATUSES:
            _fail(f"unknown status {s!r}; one of: {', '.join(STATUSES)}")
    if not any((machine, status, state, reason, text, since, until)):
        return None
    return InstanceFilter(machine=machine, statuses=tuple(status) if status else None,
                          states=tuple(state) if state else None,
                          reasons=tuple(reason) if reason else None, text=text,
                          created_after=_when_arg(since), created_before=_when_arg(until),
                          top_level=not children)


def _act(action: str, ids: list[str] | None, where: Any, *, yes: bool, batch: int,
         by: str | None, reason: str | None, db: str | None,
         machines: list[str] | None = None) -> None:
    """``action`` on each of ``ids``, or on every instance ``where`` matches."""
    if bool(ids) == (where is not None):
        _fail(f"give instance ids or a query (--machine/--status/…) to {_command(action)}, not "
              f"{'both' if ids else 'neither'}")
    dry = not ids and not yes  # a dry run writes nothing, not even a definition
    engine = trusting(_new_engine(_open(db), llm=None, keep_definitions=not dry), machines or [])
    try:
        if ids:
            for iid in ids:
                _single(engine, action, _find(engine.store, iid).id, by, reason)
        else:
            _query(engine, action, where, yes=yes, batch=batch, by=by, reason=reason)
    finally:
        engine.close()


def _single(engine: Engine, action: str, iid: str, by: str | None, reason: str | None) -> None:
    who = operator(by)
    if action == "cancel":
        rec = engine.cancel(iid, reason or "cancelled", operator=who)
        out.print(shown(f"{rec.id}: cancelled in state {rec.state}"))
    elif action == "resume":
        rec = engine.restart(iid, by=who)
        out.print(shown(f"{rec.id}: restarted, {rec.status} in state {rec.state}"))
    elif action == "pause":
        rec = engine.pause(iid, by=who, reason=reason or "paused")
        how = ("paused" if rec.status == "paused"
               else "pause requested: applies when its running step commits")
        out.print(shown(f"{rec.id}: {how} (state {rec.state})"))
    else:
        rec = engine.unpause(iid, by=who)
        out.print(shown(f"{rec.id}: {rec.status} in state {rec.state}"))


#: What the dry run says ``--yes`` does.
_VERBS = {"cancel": "cancels", "pause": "pauses", "unpause": "unpauses", "fork": "forks",
          "rerun": "reruns", "resume": "restarts"}
#: The command that runs an ``Engine.bulk`` action, where their names differ (``fsm
#: restart`` is the bulk ``resume``; ``fsm resume`` is another command).
_COMMANDS = {"resume": "restart"}


def _command(action: str) -> str:
    """The ``fsm`` command running the bulk ``action``: what its messages call it."""
    return _COMMANDS.get(action, action)


def _query(engine: Engine, action: str, where: Any, *, yes: bool, batch: int,
           by: str | None, reason: str | None, **options: Any) -> None:
    """``action`` on every instance ``where`` matches: a dry run (count and sample) unless
    ``yes``; ``options`` go to ``Engine.bulk`` (``state``, ``reuse_llm``, ``redeliver``)."""
    plan = engine.bulk_plan(action, where, preview=not yes)
    if not yes:
        for rec in plan.sample:
            typer.echo(shown(f"would {_command(action)} {rec.id} ({rec.machine}, {rec.status}, "
                             f"{rec.state}, {rec.reason or '-'})"))
        more = f" (first {len(plan.sample)} shown)" if plan.count > len(plan.sample) else ""
        typer.echo(f"{plan.count} instance(s) match{more}; --yes {_VERBS[action]} them")
        return
    done = engine.bulk(plan, by=operator(by), reason=reason, batch=batch, **options)
    typer.echo(f"{_command(action)}: {done.changed} changed, {done.skipped} skipped (already done or "
               f"no longer applies), {done.requested} requested, in {done.batches} "
               "transaction(s)")
    for line in done.errors:
        typer.echo(shown(line), err=True)
    if done.errors:  # some were refused (each said above): not a clean run for a script
        raise typer.Exit(1)


@app.command()
def cancel(ids: list[str] | None = IDS, db: str | None = DB,
           machine: str | None = MACHINE, status: list[str] | None = STATUS,
           state: list[str] | None = STATE, reason: list[str] | None = REASON,
           text: str | None = TEXT, since: str | None = SINCE, until: str | None = UNTIL,
           children: bool = CHILDREN, yes: bool = YES, batch: int = BATCH, by: str | None = AS) -> None:
    """Cancel instances, also ones running in another process."""
    _act("cancel", ids, _where(machine, status, state, reason, text, since, until, children),
         yes=yes, batch=batch, by=by, reason=None, db=db)


@app.command()
def pause(ids: list[str] | None = IDS, db: str | None = DB,
          machine: str | None = MACHINE, status: list[str] | None = STATUS,
          state: list[str] | None = STATE, reason: list[str] | None = REASON,
          text: str | None = TEXT, since: str | None = SINCE, until: str | None = UNTIL,
          children: bool = CHILDREN, why: str | None = typer.Option(None, "--why", metavar="TEXT",
                                         help="The pause's reason (default: paused)."),
          yes: bool = YES, batch: int = BATCH, by: str | None = AS) -> None:
    """Pause instances between steps (a running step finishes and commits first): no
    worker or resume takes them, their timers stop, until `fsm unpause`."""
    _act("pause", ids, _where(machine, status, state, reason, text, since, until, children),
         yes=yes, batch=batch, by=by, reason=why, db=db)


@app.command()
def unpause(ids: list[str] | None = IDS, db: str | None = DB,
            machine: str | None = MACHINE, status: list[str] | None = STATUS,
            state: list[str] | None = STATE, reason: list[str] | None = REASON,
            text: str | None = TEXT, since: str | None = SINCE, until: str | None = UNTIL,
            children: bool = CHILDREN, yes: bool = YES, batch: int = BATCH, by: str | None = AS) -> None:
    """End pauses: each instance gets back the status it had, its timers the time left."""
    _act("unpause", ids, _where(machine, status, state, reason, text, since, until, children),
         yes=yes, batch=batch, by=by, reason=None, db=db)


@app.command()
def restart(ids: list[str] | None = IDS, db: str | None = DB,
            machine: str | None = MACHINE, status: list[str] | None = STATUS,
            state: list[str] | None = STATE, reason: list[str] | None = REASON,
            text: str | None = TEXT, since: str | None = SINCE, until: str | None = UNTIL,
            children: bool = CHILDREN, yes: bool = YES, batch: int = BATCH, by: str | None = AS,
            machines: list[str] = MACHINES) -> None:
    """Resume cancelled or failed instances where they stopped (a cancelled one in its
    state, a failed one just before its last failure): runnable again for a worker or
    `fsm resume` (which itself only continues instances whose worker died)."""
    _act("resume", ids, _where(machine, status, state, reason, text, since, until, children),
         yes=yes, batch=batch, by=by, reason=None, db=db, machines=machines)


@app.command()
def send(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
         trigger: str = typer.Argument(..., help="A trigger declared from its waiting state."),
         sets: list[str] = typer.Option([], "--set", metavar="FIELD=VALUE",
                                        help="Context update (JSON or text; repeatable)."),
         json_file: str | None = typer.Option(None, "--json-file", metavar="FILE",
                                              help="Context update: a JSON object file."),
         by: str | None = AS, db: str | None = DB, machines: list[str] = MACHINES) -> None:
    """Fire a trigger on a waiting instance with a context update, validated by the
    machine's context model, in one transaction; a worker (or `fsm resume`) continues it."""
    import asyncio

    from .review import _types, _update
    _update(sets, json_file)  # a malformed --set or file: refused before the store is opened
    engine = trusting(_new_engine(_open(db), llm=None), machines)
    try:
        iid = _find(engine.store, instance_id).id
        update = _update(sets, json_file, _types(engine, iid) if sets else None)
        rec = asyncio.run(engine.signal(iid, trigger, update, operator=operator(by)))
    finally:
        engine.close()
    out.print(shown(f"{rec.id}: {trigger} sent; now {rec.status} in state {rec.state}"))


def _review_app() -> Any:
    from .review import review_app
    return review_app


@_review_app().command("link")
def review_link(item: str = typer.Argument(..., help="Review item id (an unambiguous prefix)."),
                ttl: str = typer.Option("24h", "--ttl", metavar="AGE",
                                        help="How long the link works (30m, 24h, 7d)."),
                by: str | None = AS,
                base: str = typer.Option("http://127.0.0.1:8765", "--base", metavar="URL",
                                         help="Where `fsm ui --write` serves the console."),
                db: str | None = DB) -> None:
    """Print a signed link to the console page deciding this item: valid once, until it
    expires, for this reviewer only; opening it needs no other credential."""
    import time

    from ..runtime.kinds import review_links
    from ..runtime.kinds.reviews import find
    from .observe import parse_age
    store = _open(db)
    try:
        found = find(store, item)
        if found.status != "open":
            _fail(f"review {found.id} is already {found.status}")
        link = review_links.sign(store, found.id, operator(by), parse_age(ttl), time.time())
    finally:
        store.close()
    typer.echo(review_links.url(base, link))


@_review_app().command("rotate-key")
def review_rotate_key(db: str | None = DB) -> None:
    """Replace the key that signs review links: every link given out before stops working."""
    from ..runtime.kinds import review_links
    store = _open(db)
    try:
        review_links.rotate_key(store)
    finally:
        store.close()
    typer.echo("review link key rotated: links signed before no longer work")
