"""``fsm``: the command line, a thin layer over the public API.

Every user error (missing module, broken definition, unknown id, a file
that is not an fsm database, bad input) prints one line ``fsm: error: …`` on
stderr and exits with status 2; no traceback reaches the user.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import FsmError, InstanceNotFound, InvalidInput, StoreError
from .views import context_after, history_json, instance_json, outbox_json
from .runtime import Engine
from .store import SqliteStore

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Durable finite state machines for LLM workflows.")
out = Console()
DB = typer.Option("fsm.db", "--db", help="SQLite database file.")


def _fail(msg: str) -> None:
    typer.echo(f"fsm: error: {msg}", err=True)
    raise typer.Exit(2)


def _open(db: str, *, create: bool = False) -> SqliteStore:
    if not create and not os.path.exists(db):
        raise StoreError(f"no database at {db} (run `fsm run` first, or pass --db)")
    return SqliteStore(db)


def _engine(db: str, *, llm: str | None = None, faults: str | None = None,
            seed: int | None = None, create: bool = False, **kw: Any) -> Engine:
    provider = None
    if llm is not None or faults is not None or create:
        from .llm import provider_from_spec
        provider = provider_from_spec(llm, faults=faults, seed=seed)
    return Engine(_open(db, create=create), llm=provider, seed=seed, **kw)


def _input_for(arg: str) -> dict[str, Any]:
    """A CLI input: a ``.json`` file is the input object; any other file is ``{"path": …}``."""
    if not os.path.isfile(arg):
        raise InvalidInput(f"input file not found: {arg}")
    if arg.endswith(".json"):
        try:
            with open(arg, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot read JSON input {arg}: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"JSON input {arg} must hold an object")
        return data
    return {"path": os.path.abspath(arg)}


def _summary(records: list[Any]) -> Table:
    table = Table(title="instances")
    for col in ("instance", "machine", "state", "status", "reason", "transitions", "tokens"):
        table.add_column(col)
    for r in records:
        if isinstance(r, FsmError):
            table.add_row(r.instance_id or "?", "", "", "error", str(r), "", "")
            continue
        table.add_row(r.id, r.machine, r.state, r.status, r.reason or "", str(r.loop_count),
                      str(r.tokens_used))
    return table


async def _run_all(engine: Engine, ids: list[str], resume: bool, quiet: bool) -> list[Any]:
    total = len(ids)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True),
                  disable=quiet or not sys.stderr.isatty()) as bar:
        task = bar.add_task("running", total=total)

        def on_step(rec: Any) -> None:
            if rec.final or rec.status == "waiting":
                bar.advance(task)
        try:
            if resume:
                return await engine.resume(on_step)
            return await engine.run_many(ids, on_step)
        finally:
            await engine.aclose()


def _finish(records: list[Any], as_json: bool) -> None:
    if as_json:
        out.print_json(data=[instance_json(r) if not isinstance(r, FsmError) else
                             {"error": str(r), "id": r.instance_id} for r in records])
    else:
        out.print(_summary(records))
    ok = all(not isinstance(r, FsmError) and r.final for r in records)
    raise typer.Exit(0 if ok else 1)


@app.command()
def run(module: str = typer.Argument(..., help="Machine module: path/to/file.py or dotted name."),
        more: Optional[list[str]] = typer.Argument(None, metavar="[FILE]...",
                                                   help="More input files (--input A B C)."),
        input: list[str] = typer.Option([], "--input", "-i", help="Input file(s)."),
        db: str = DB, budget: Optional[int] = typer.Option(None, "--budget", help="Token budget per instance."),
        llm: Optional[str] = typer.Option(None, "--llm", help="local | openai | scripted:FILE (or FSM_LLM)."),
        faults: Optional[str] = typer.Option(None, "--faults", help="e.g. timeout=0.1,http429=0.1"),
        seed: Optional[int] = typer.Option(None, "--seed", help="Seed for faults and jitter."),
        concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Max instances at once."),
        deadline: Optional[float] = typer.Option(None, "--deadline", help="Seconds each instance may take in all."),
        as_json: bool = typer.Option(False, "--json"), quiet: bool = typer.Option(False, "--quiet", "-q")) -> None:
    """Start one instance per input file and run them all concurrently."""
    input = list(input) + list(more or [])
    if not input:
        _fail("give at least one --input FILE")
    inputs = [_input_for(i) for i in input]
    engine = _engine(db, llm=llm, faults=faults, seed=seed, create=True, concurrency=concurrency)
    engine.load(module)
    ids = [engine.start(module, data, token_budget=budget, deadline_s=deadline) for data in inputs]
    _finish(asyncio.run(_run_all(engine, ids, False, quiet)), as_json)


@app.command()
def resume(db: str = DB, llm: Optional[str] = typer.Option(None, "--llm"),
           faults: Optional[str] = typer.Option(None, "--faults"),
           seed: Optional[int] = typer.Option(None, "--seed"),
           as_json: bool = typer.Option(False, "--json"), quiet: bool = typer.Option(False, "--quiet", "-q")) -> None:
    """Continue every unfinished instance whose worker died."""
    engine = _engine(db, llm=llm, faults=faults, seed=seed, create=False)
    if engine.llm is None:
        from .llm import provider_from_spec
        engine.llm = engine.driver.provider = provider_from_spec(None)
    _finish(asyncio.run(_run_all(engine, [], True, quiet)), as_json)


@app.command()
def step(instance_id: str, db: str = DB, llm: Optional[str] = typer.Option(None, "--llm"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Run exactly one step of an instance."""
    engine = _engine(db, llm=llm, create=False)
    if engine.llm is None:
        from .llm import provider_from_spec
        engine.llm = engine.driver.provider = provider_from_spec(None)

    async def go() -> Any:
        try:
            return await engine.step(instance_id)
        finally:
            await engine.aclose()
    rec = asyncio.run(go())
    if as_json:
        out.print_json(data=instance_json(rec))
    else:
        out.print(f"{rec.id}: {rec.state} ({rec.status}) after {rec.loop_count} transitions")


@app.command("list")
def list_(db: str = DB, status: Optional[str] = typer.Option(None, "--status"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """List instances."""
    store = _open(db)
    records = store.list(statuses=[status] if status else None)
    if as_json:
        out.print_json(data=[instance_json(r) for r in records])
    else:
        out.print(_summary(records))


@app.command()
def show(instance_id: str, db: str = DB, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one instance."""
    data = instance_json(_open(db).get(instance_id))
    if as_json:
        out.print_json(data=data)
        return
    for key, value in data.items():
        out.print(f"[bold]{key}[/bold]: {json.dumps(value, ensure_ascii=False)}", highlight=False)


@app.command()
def history(instance_id: str, db: str = DB, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show an instance's audit history (every transition, with guards and tokens)."""
    store = _open(db)
    rows = history_json(store.get(instance_id), store.history(instance_id))
    if as_json:
        out.print_json(data=rows)
        return
    table = Table(title=f"history of {instance_id}")
    for col in ("seq", "source", "dest", "trigger", "guards", "ms", "tokens", "error"):
        table.add_column(col)
    for r in rows:
        guards = ", ".join(f"{g[0]}={g[1]}" for g in r["guards"])
        table.add_row(str(r["seq"]), r["source"], r["dest"], r["trigger"], guards,
                      f"{r['duration_ms']:.1f}", str(r["tokens"]), r["error"] or r["reason"] or "")
    out.print(table)


@app.command()
def cancel(instance_id: str, db: str = DB) -> None:
    """Cancel an instance, also one running in another process."""
    engine = Engine(_open(db))
    try:
        rec = engine.cancel(instance_id)
    finally:
        engine.close()
    out.print(f"{rec.id}: cancelled in state {rec.state}")


@app.command()
def outbox(db: str = DB, as_json: bool = typer.Option(False, "--json")) -> None:
    """List side-effect deliveries (idempotency keys and their status)."""
    rows = outbox_json(_open(db).outbox())
    if as_json:
        out.print_json(data=rows)
        return
    table = Table(title="outbox")
    for col in ("instance", "state", "idempotency key", "status", "attempts"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["instance_id"], r["state"], r["key"], r["status"], str(r["attempts"]))
    out.print(table)


@app.command()
def diagram(module: str, output: Optional[str] = typer.Option(None, "-o", "--output",
                                                              help="File: .svg, .png or .dot"),
            mermaid: bool = typer.Option(False, "--mermaid", help="Print Mermaid stateDiagram-v2."),
            instance: Optional[str] = typer.Option(None, "--instance", help="Overlay this instance."),
            db: str = DB) -> None:
    """Render a machine's diagram, optionally overlaid with one instance's path."""
    from .diagram import build_graph, render, to_dot, to_mermaid
    from .runtime import load_machine
    machine, _ = load_machine(module)
    from .runtime.compiled import compile_machine
    compile_machine(machine)
    overlay = None
    if instance:
        store = _open(db)
        rec = store.get(instance)
        overlay = {"instance_id": rec.id, "state": rec.state, "status": rec.status,
                   "history": [{"seq": h.seq, "source": h.source, "dest": h.dest,
                                "trigger": h.trigger} for h in store.history(instance)]}
    graph = build_graph(machine.export(), overlay)
    if mermaid:
        typer.echo(to_mermaid(graph))
    if output:
        try:
            render(graph, output)
        except (ValueError, RuntimeError, OSError) as exc:
            _fail(str(exc).splitlines()[0])
        out.print(f"wrote {output}")
    elif not mermaid:
        typer.echo(to_dot(graph))


def main() -> None:
    """Entry point: run the app, turning every ``FsmError`` into one line and exit 2."""
    try:
        app()
    except FsmError as exc:
        typer.echo(f"fsm: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("fsm: interrupted; unfinished instances continue with `fsm resume`", err=True)
        sys.exit(130)


__all__ = ["app", "main", "context_after", "InstanceNotFound"]


if __name__ == "__main__":
    main()
