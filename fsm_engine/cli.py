"""``fsm``: the command line, a thin layer over the public API.

Every user error (missing module, broken definition, unknown id, a file
that is not an fsm database, bad input) prints one line ``fsm: error: …`` on
stderr and exits with status 2; no traceback reaches the user.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from .cli_trust import MACHINES, refuse_untrusted, trusting
from .errors import FsmError, InstanceNotFound, InvalidInput
from .runtime import Engine
from .store import Store, is_postgres, open_store, store_url
from .terminal import console, error_line, json_text, safe_logging, shown
from .views import instance_json

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Durable finite state machines for LLM workflows.")
out = console()  # no markup, stored text shown safely (``terminal``)
DB = typer.Option(None, "--db", show_default=False,
                  help="Store: a SQLite file, sqlite:///REL.db or sqlite:////ABS.db, or postgresql://… "
                       "(default: $FSM_DB, else fsm.db).")



def _version(value: bool) -> None:
    if value:
        from . import __version__
        typer.echo(f"fsm_engine {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Durable finite state machines for LLM workflows."""


def _print_json(data: Any) -> None:
    """Strict JSON on stdout (a database written before values were checked may hold a
    bare NaN: it is printed as the string ``"NaN"``, never as a non-standard token)."""
    try:
        text = json.dumps(data, ensure_ascii=False, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), ensure_ascii=False, indent=2, allow_nan=False)
    typer.echo(json_text(text))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _fail(msg: str) -> NoReturn:
    typer.echo(error_line(msg), err=True)
    raise typer.Exit(2)


def _open(db: str | None, *, create: bool = False) -> Store:
    """The store ``db`` names (``store_url``); only ``fsm run``/``start``/``worker``
    (``create``) may start a new one.  An older schema is migrated forward on open."""
    return open_store(store_url(db), create=create)


def _engine(db: str | None, *, llm: list[str] | None = None, faults: str | None = None,
            seed: int | None = None, create: bool = False,
            machines: Sequence[str] = ()) -> Engine:
    """An engine on ``db`` with the selected providers by model name (local ones load
    lazily) and the ``machines`` modules loaded (``trusting``)."""
    from .llm.select import providers_from_specs
    from .runtime.rates import limits_from_specs
    providers = providers_from_specs(llm, faults=faults, seed=seed)
    limits = limits_from_specs(None)  # FSM_RATE_LIMIT_<MODEL> (fsm worker: --rate-limit too)
    engine = Engine(_open(db, create=create), llm=providers, seed=seed, rate_limits=limits)
    return trusting(engine, machines)


def _find(store: Store, instance_id: str) -> Any:
    """The instance with this id, or the only one whose id starts with it (like git)."""
    try:
        return store.get(instance_id)
    except InstanceNotFound:
        matches = [r for r in store.list() if r.id.startswith(instance_id)] if instance_id else []
        ids = {r.id for r in matches}  # a parent's prefix also starts its children's ids
        matches = [r for r in matches if r.parent_id not in ids]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise InvalidInput(f"id prefix {instance_id!r} matches {len(matches)} instances") from None
        raise


def _input_for(arg: str) -> dict[str, Any]:
    """A CLI input: a ``.json`` file is the input object; any other file is ``{"path": …}``."""
    name = shown(arg)
    if not os.path.exists(arg):
        raise InvalidInput(f"input file not found: {name}")
    if os.path.isdir(arg):
        raise InvalidInput(f"input {name} is a directory, not a file")
    if not os.path.isfile(arg):
        raise InvalidInput(f"input {name} is not a regular file")
    if arg.endswith(".json"):
        try:
            with open(arg, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot read JSON input {name}: {exc}") from None
        except RecursionError:
            raise InvalidInput(f"cannot read JSON input {name}: it nests too deep") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"JSON input {arg} must hold an object")
        return data
    return {"path": os.path.abspath(arg)}


def _live(store: Store) -> set[str]:
    """Ids of the live workers (to show instances of dead ones as ``orphaned``)."""
    import time as _time

    from .runtime.workers import live_ids
    return live_ids(store.workers(), _time.time(), 10.0)


async def _run_all(engine: Engine, ids: list[str], resume: bool, quiet: bool) -> list[Any]:
    total = len(ids)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console(stderr=True),
                  disable=quiet or not sys.stderr.isatty()) as bar:
        task = bar.add_task("running", total=total)
        plain = not quiet and not sys.stderr.isatty()  # a log: a line per instance instead
        ended: set[str] = set()

        def on_step(rec: Any) -> None:
            if rec.final or rec.status == "waiting":
                bar.advance(task)
            if plain and rec.final and rec.id not in ended:
                ended.add(rec.id)
                print(shown(f"fsm: {len(ended)}/{total} {rec.id} {rec.status}"
                            + (f" ({rec.reason})" if rec.reason else "")),
                      file=sys.stderr, flush=True)
        try:
            if resume:
                return await engine.resume(on_step)
            return await engine.run_many(ids, on_step)
        finally:
            await engine.aclose()
            await engine.models.aclose()


def _preload(engine: Engine) -> None:
    """Start the local models (load + self-test) before any instance depends on them, so a
    broken native build or a refused model is one ``fsm: error:`` line, nothing run."""
    loads = [getattr(getattr(p, "inner", p), "load", None) for p in engine.models.unique()]
    if not any(loads):
        return

    async def go() -> None:
        try:
            for load in loads:  # through FaultInjector's ``inner``
                if load is not None:
                    await load()
        except FsmError:
            await engine.models.aclose()
            raise
    asyncio.run(go())


def _drive(engine: Engine, ids: list[str], resume: bool, quiet: bool) -> list[Any]:
    """Run to the end; Ctrl-C stops with a hint (nothing is lost: ``fsm resume`` continues)."""
    try:
        return asyncio.run(_run_all(engine, ids, resume, quiet))
    except KeyboardInterrupt:
        typer.echo("fsm: interrupted; unfinished instances continue with `fsm resume`", err=True)
        raise typer.Exit(130) from None


def _tally(records: list[Any], fields: Sequence[str]) -> list[str]:
    """``"field: 5 model, 2 constrained, 1 rules"`` per tallied context field (most first)."""
    lines = []
    for name in fields:
        counts = Counter(str(r.context.get(name) or "(none)") for r in records
                         if not isinstance(r, FsmError) and r.final)
        if counts:
            lines.append(f"{name}: " + ", ".join(f"{n} {v}" for v, n in counts.most_common()))
    return lines


def exit_code(records: list[Any]) -> int:
    """0 when every instance completed, 1 when any failed, was cancelled or stopped on an
    error, else 3 (some are not final: waiting, or left for ``fsm resume``)."""
    if any(isinstance(r, FsmError) or r.status in ("failed", "cancelled") for r in records):
        return 1
    return 0 if all(r.status == "completed" for r in records) else 3


def _finish(records: list[Any], as_json: bool, tally: Sequence[str] = (),
            hint: str | None = None) -> None:
    """Print the closing table and tally (or JSON), then ``hint`` (unless JSON); exit with
    ``exit_code``."""
    if as_json:
        _print_json([instance_json(r) if not isinstance(r, FsmError) else
                             {"error": str(r), "id": r.instance_id} for r in records])
    else:
        from .cli_tables import print_records
        print_records(out, records)
        for line in _tally(records, tally):
            out.print(shown(line), highlight=False)
        if hint:
            out.print(shown(hint), highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(exit_code(records))


@app.command()
def run(module: str = typer.Argument(..., help="Machine module: path/to/file.py or dotted name."),
        more: list[str] | None = typer.Argument(None, metavar="[FILE]...",
                                                   help="More input files (--input A B C)."),
        input: list[str] = typer.Option([], "--input", "-i", help="Input file(s)."),
        db: str = DB, budget: int | None = typer.Option(None, "--budget", min=1, help="Token budget per instance."),
        llm: list[str] | None = typer.Option(
            None, "--llm", help="Model: local | local:gemma-3-270m | local:PATH.gguf | openai[:MODEL] | "
                                "scripted:FILE (default FSM_LLM); NAME=SPEC for the states declaring "
                                "llm=NAME (repeatable; or FSM_LLM_<NAME>)."),
        faults: str | None = typer.Option(None, "--faults", help="e.g. timeout=0.1,http429=0.1"),
        seed: int | None = typer.Option(None, "--seed", help="Seed for faults and jitter."),
        concurrency: int | None = typer.Option(None, "--concurrency", min=1,
                                                  help="Max instances at once (default: all; 2 with the local model)."),
        deadline: float | None = typer.Option(None, "--deadline", min=0.001,
                                                 help="Seconds each instance may take in all."),
        as_json: bool = typer.Option(False, "--json", help="Print the final records as JSON."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
        local: bool = typer.Option(False, "--local",
                                   help="With a postgresql:// store: run here, not on workers.")) -> None:
    """Start one instance per input file and run them all concurrently (on a
    postgresql:// store: enqueue them for `fsm worker`s and wait, unless --local)."""
    input = list(input) + list(more or [])
    if not input:
        _fail("give at least one --input FILE")
    inputs = [_input_for(i) for i in input]
    from .runtime import load_machine
    from .runtime.compiled import compile_machine
    machine, ref = load_machine(module)
    compile_machine(machine)  # a broken module or definition creates no database
    if is_postgres(store_url(db)) and not local:
        from .cli_scale import enqueue_and_wait
        enqueue_and_wait(db, machine, ref, inputs, budget=budget, deadline=deadline,
                         as_json=as_json, quiet=quiet)
        return
    engine = _engine(db, llm=llm, faults=faults, seed=seed, create=True)
    engine.concurrency = concurrency or _default_concurrency(engine)
    _preload(engine)
    engine.register(machine, ref)
    header = _header(machine.name, len(inputs), engine)  # a model it can't name: no instance
    try:
        ids = engine.start_many(machine, inputs, token_budget=budget, deadline_s=deadline)
    except InvalidInput as exc:
        engine.close()
        at = getattr(exc, "index", None)
        raise InvalidInput(f"{shown(input[at])}: {exc}" if at is not None else str(exc)) from None
    if not quiet:
        typer.echo(header, err=True)
    from .cli_observe import viewer_hint
    _finish(_drive(engine, ids, False, quiet), as_json, machine.tally,
            None if quiet else viewer_hint(db))


def _header(machine: str, count: int, engine: Engine) -> str:
    """``fsm run``'s first line: the machine, how many instances, which model serves them
    (per model name when states name several; an OpenAI-compatible server named no model
    is asked for its only one)."""
    from .runtime.models import DEFAULT
    named = [(name, _describe(p)) for name, p in engine.models.by_name.items()]
    llm = "; ".join(d if name == DEFAULT else f"{name} = {d}" for name, d in named) or "none"
    return f"fsm: {machine}: {count} instance(s); llm: {llm}"


def _describe(provider: Any) -> str:
    inner = provider
    while getattr(inner, "inner", None) is not None:  # a FaultInjector wraps the real one
        inner = inner.inner
    resolve = getattr(inner, "resolve_model_sync", None)
    if resolve is not None:
        resolve()
    describe = getattr(inner, "describe", None)
    text = describe() if callable(describe) else (
        f"{getattr(inner, 'name', 'llm')} model {getattr(inner, 'model', '?')!r}")
    return text + (" (with injected faults)" if getattr(provider, "rates", None) else "")


def _default_concurrency(engine: Engine) -> int | None:
    """The embedded model runs one call at a time: queueing every instance behind it
    would eat their step timeouts, so with one at most 2 instances step at once."""
    names = [str(getattr(p, "name", "")) for p in engine.models.unique()]
    return 2 if any(name.endswith("local") for name in names) else None


@app.command()
def resume(db: str = DB,
           llm: list[str] | None = typer.Option(None, "--llm", help="As for `fsm run` (repeatable)."),
           faults: str | None = typer.Option(None, "--faults", help="As for `fsm run`."),
           seed: int | None = typer.Option(None, "--seed", help="Seed for faults and jitter."),
           concurrency: int | None = typer.Option(None, "--concurrency", min=1,
                                                     help="Max instances at once (as for `fsm run`)."),
           as_json: bool = typer.Option(False, "--json", help="Print the final records as JSON."),
           quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
           machines: list[str] = MACHINES) -> None:
    """Continue every unfinished instance whose worker died (refused, nothing run, when
    one names a machine module neither under the machines root nor given with --machines)."""
    engine = _engine(db, llm=llm, faults=faults, seed=seed, create=False, machines=machines)
    engine.concurrency = concurrency or _default_concurrency(engine)
    todo = engine.resumable()
    if not todo:
        engine.close()
        out.print("nothing to resume: no unfinished instance without a live worker")
        raise typer.Exit(0)
    refuse_untrusted(engine, todo)
    _preload(engine)
    _finish(_drive(engine, [], True, quiet), as_json)


@app.command()
def step(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
         db: str = DB,
         llm: list[str] | None = typer.Option(None, "--llm", help="As for `fsm run` (repeatable)."),
         as_json: bool = typer.Option(False, "--json", help="Print the new record as JSON."),
         machines: list[str] = MACHINES) -> None:
    """Run exactly one step of an instance."""
    engine = _engine(db, llm=llm, create=False, machines=machines)
    instance_id = _find(engine.store, instance_id).id

    async def go() -> Any:
        try:
            return await engine.step(instance_id)
        finally:
            await engine.aclose()
    rec = asyncio.run(go())
    if as_json:
        _print_json(instance_json(rec))
    else:
        out.print(f"{rec.id}: {rec.state} ({rec.status}) after {rec.loop_count} transitions")


@app.command()
def show(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
         db: str = DB, as_json: bool = typer.Option(False, "--json", help="Print it as JSON.")) -> None:
    """Show one instance, with its failed attempts (errors, tokens billed, next try)."""
    store = _open(db)
    rec = _find(store, instance_id)
    data = instance_json(rec) | {"attempts": [asdict(a) for a in store.attempts(rec.id)]}
    from .views import limits_json
    limits = limits_json(rec, store.history(rec.id))
    if limits:  # rate-limit waits, breaker-open fallbacks, budget exhaustion: each apart
        data["limits"] = limits
    kids = store.children(rec.id)
    if kids:
        data["children"] = [{"id": k.id, "branch": k.branch, "machine": k.machine,
                             "state": k.state, "status": k.status, "reason": k.reason,
                             "tokens_used": k.tokens_used} for k in kids]
    if as_json:
        _print_json(data)
        return
    for key, value in data.items():
        out.print(Text.assemble((key, "bold"), ": " + shown(json.dumps(value, ensure_ascii=False))),
                  highlight=False)


@app.command()
def diagram(module: str = typer.Argument(..., help="Machine module: path/to/file.py or dotted name."),
            output: str | None = typer.Option(None, "-o", "--output",
                                                 help="File: .svg, .png or .dot (Mermaid text with --mermaid)"),
            mermaid: bool = typer.Option(False, "--mermaid", help="Mermaid stateDiagram-v2 instead of graphviz."),
            instance: str | None = typer.Option(None, "--instance",
                                                   help="Overlay this instance's path, with attempts, "
                                                        "time and tokens per state."),
            stats: bool = typer.Option(False, "--stats",
                                       help="Overlay every instance of the machine in --db: "
                                            "instances per state, mean time, tokens, edge counts."),
            db: str = DB) -> None:
    """Render a machine's diagram, optionally overlaid with one instance's path or with
    the statistics of all its instances."""
    from .diagram import build_graph, render, to_dot, to_mermaid
    from .runtime import load_machine
    if instance and stats:
        _fail("give --instance or --stats, not both")
    machine, _ = load_machine(module)
    from .runtime.compiled import compile_machine
    compile_machine(machine)
    overlay = None
    if instance:
        from .diagram.overlays import instance_overlay
        store = _open(db)
        rec = _find(store, instance)
        if rec.machine != machine.name:
            _fail(f"instance {rec.id} belongs to machine {rec.machine!r}, not {machine.name!r}")
        overlay = instance_overlay(rec, store.history(rec.id), store.attempts(rec.id))
    elif stats:
        from .diagram.overlays import aggregate_overlay
        from .stats import machine_stats
        from .store.records import InstanceFilter
        figures = machine_stats(_open(db), InstanceFilter(machine=machine.name))
        if machine.name not in figures:
            _fail(f"no instances of machine {machine.name!r} in {db}")
        overlay = aggregate_overlay(figures[machine.name])
    graph = build_graph(machine.export(), overlay)
    if not output:
        typer.echo(to_mermaid(graph) if mermaid else to_dot(graph))
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        if mermaid:  # Mermaid text whatever the file's extension
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(to_mermaid(graph))
        else:
            render(graph, output)
    except (ValueError, RuntimeError, OSError) as exc:
        _fail(str(exc).splitlines()[0])
    out.print(f"wrote {output}")


from . import cli_console, cli_fork, cli_inspect, cli_limits, cli_migrate, cli_observe, cli_review, cli_scale  # noqa: E402,F401 - limits; worker, start, wait, workers  # noqa: E402,F401  (register list, history, outbox,

#                                         stats, ui, prune, check)


def main() -> None:
    """Entry point: run the app, turning every ``FsmError`` into one line and exit 2."""
    if not logging.getLogger().handlers:  # warnings print as Python would, but made safe
        safe_logging()
    try:
        code = app(standalone_mode=False)
    except FsmError as exc:
        typer.echo(error_line(exc), err=True)
        sys.exit(2)
    except typer.TyperException as exc:  # usage errors: one line too, not a usage box
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            sys.exit(0)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        typer.echo(error_line(' '.join(str(message).split())), err=True)
        sys.exit(getattr(exc, "exit_code", 2) or 2)
    except typer.Abort:
        typer.echo("fsm: interrupted; unfinished instances continue with `fsm resume`", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("fsm: interrupted; unfinished instances continue with `fsm resume`", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]


if __name__ == "__main__":  # python -m fsm_engine.cli: run the real module (whose app
    from fsm_engine.cli import main as _main  # has every command registered), not this copy
    _main()
