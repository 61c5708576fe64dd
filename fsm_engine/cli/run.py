"""``fsm run``, ``fsm resume`` and ``fsm step``: instances run in this process."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from ..errors import FsmError, InvalidInput
from ..terminal import console, shown
from .common import (
    DB,
    MACHINES,
    _engine,
    _fail,
    _find,
    _input_for,
    _print_json,
    app,
    exit_code,
    out,
    refuse_untrusted,
)

if TYPE_CHECKING:
    from ..runtime import Engine

async def _run_all(engine: Engine, ids: list[str], resume: bool, quiet: bool) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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


def _preload(engine: Engine, lazy: bool = False) -> None:
    """Start the local models (load + self-test) before any instance depends on them, so a
    broken native build or a refused model is one ``fsm: error:`` line, nothing run.
    ``lazy`` (a machine whose states only may call a model): a model that fails to load is
    replaced by an ``Unavailable`` one naming why, which fails only a state calling it."""
    loads = [(p, getattr(getattr(p, "inner", p), "load", None)) for p in engine.models.unique()]
    if not any(load for _, load in loads):
        return

    async def go() -> list[tuple[Any, FsmError]]:
        failed = []
        for provider, load in loads:  # through FaultInjector's ``inner``
            try:
                if load is not None:
                    await load()
            except FsmError as exc:
                if not lazy:
                    await engine.models.aclose()
                    raise
                failed.append((provider, exc))
                await provider.aclose()
        return failed
    import asyncio

    from ..llm.select import Unavailable
    from ..runtime.model_registry import model_key
    for provider, exc in asyncio.run(go()):
        engine.models.replace(provider, Unavailable(model_key(provider), str(exc)))


def _drive(engine: Engine, ids: list[str], resume: bool, quiet: bool) -> list[Any]:
    """Run to the end; Ctrl-C stops with a hint (nothing is lost: ``fsm resume`` continues)."""
    try:
        import asyncio
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


def _finish(records: list[Any], as_json: bool, tally: Sequence[str] = (),
            hint: str | None = None, outcome: Sequence[str] | None = None) -> None:
    """Print the closing table and tally (or JSON), then ``hint`` (unless JSON); exit with
    ``exit_code``.  ``outcome`` (the machine's ``outcome`` fields; ``()``: the final state):
    the table shows what each instance came to."""
    from ..views import instance_json
    if as_json:
        _print_json([instance_json(r) if not isinstance(r, FsmError) else
                             {"error": str(r), "id": r.instance_id} for r in records])
    else:
        from .tables import outcome_cell, print_records
        fields = outcome
        print_records(out, records, outcome=None if fields is None
                      else (lambda rec: outcome_cell(rec, fields)))
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
    from ..runtime import load_machine
    from ..runtime.compiled import compile_machine
    from ..store import is_postgres, store_url
    machine, ref = load_machine(module, named=True)
    use = compile_machine(machine).model_use()  # a broken definition creates no database
    if use == "maybe" and llm:  # the model a user names is demanded like a declared one
        use = "declared"
    from .observe import viewer_hint
    if is_postgres(store_url(db)) and not local:
        from .scale import enqueue_and_wait
        _finish(enqueue_and_wait(db, machine, ref, inputs, budget=budget, deadline=deadline,
                                 as_json=as_json, quiet=quiet), as_json, machine.tally,
                None if quiet else viewer_hint(db), outcome=machine.outcome)  # as below
        return
    engine = _engine(db, llm=llm, faults=faults, seed=seed, create=True, models=use)
    engine.concurrency = concurrency or _default_concurrency(engine)
    if use != "none":  # "maybe": a model that fails to load fails only a state calling it
        _preload(engine, lazy=use == "maybe")
    engine.register(machine, ref)
    from .. import collector
    collector.tune_if_owned()  # machines and models loaded: see fsm_engine.collector
    header = _header(machine.name, len(inputs), engine, use)  # a model it can't name: no instance
    try:
        ids = engine.start_many(machine, inputs, token_budget=budget, deadline_s=deadline)
    except InvalidInput as exc:
        engine.close()
        at = getattr(exc, "index", None)
        raise InvalidInput(f"{shown(input[at])}: {exc}" if at is not None else str(exc)) from None
    if not quiet:
        typer.echo(shown(header), err=True)
    _finish(_drive(engine, ids, False, quiet), as_json, machine.tally,
            None if quiet else viewer_hint(db), outcome=machine.outcome)


def _header(machine: str, count: int, engine: Engine, use: str = "declared") -> str:
    """``fsm run``'s first line: the machine, how many instances, which model serves them
    (per model name when states name several; an OpenAI-compatible server named no model
    is asked for its only one).  ``use``: ``CompiledMachine.model_use`` ("maybe": a model
    that cannot be described is shown as unavailable, not refused)."""
    from ..runtime.model_registry import DEFAULT
    if use == "none":
        return f"fsm: {machine}: {count} instance(s); llm: none (no state calls a model)"
    named = [(name, _describe(p, lazy=use == "maybe")) for name, p in engine.models.by_name.items()]
    llm = "; ".join(d if name == DEFAULT else f"{name} = {d}" for name, d in named) or "none"
    return f"fsm: {machine}: {count} instance(s); llm: {llm}"


def _describe(provider: Any, lazy: bool = False) -> str:
    """One line naming ``provider``'s model; ``FsmError`` when it cannot be resolved (a
    missing model file, a server listing no model), unless ``lazy``: then the line says
    so, and the call that needs it fails."""
    inner = provider
    while getattr(inner, "inner", None) is not None:  # a FaultInjector wraps the real one
        inner = inner.inner
    try:
        resolve = getattr(inner, "resolve_model_sync", None)
        if resolve is not None:
            resolve()
        describe = getattr(inner, "describe", None)
        text = describe() if callable(describe) else (
            f"{getattr(inner, 'name', 'llm')} model {getattr(inner, 'model', '?')!r}")
    except FsmError as exc:
        if not lazy:
            raise
        text = f"{getattr(inner, 'name', 'llm')} model (unavailable: {exc})"
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
    engine = _engine(db, llm=llm, faults=faults, seed=seed, create=False, machines=machines,
                     models="deferred")
    todo = engine.resumable()
    if not todo:
        engine.close()
        out.print("nothing to resume: no unfinished instance without a live worker")
        raise typer.Exit(0)
    refuse_untrusted(engine, todo)
    use = _use_of(engine, todo)  # the models are built here, when one may be called
    engine.concurrency = concurrency or _default_concurrency(engine)
    if use != "none":
        _preload(engine, lazy=use == "maybe" and not llm)
    if not quiet:  # (a model it cannot name is shown as unavailable: the calls fail)
        typer.echo(shown(_header("resume", len(todo), engine, "maybe" if use != "none"
                                 else "none")), err=True)
    _finish(_drive(engine, [r.id for r in todo], True, quiet), as_json)  # the count shown


def _use_of(engine: Engine, records: Sequence[Any]) -> str:
    """The strongest ``CompiledMachine.model_use`` of ``records``' machines, each
    registered now (so the deferred models are built: ``Models.defer``); a machine that
    cannot load here is left to the run, which leaves its instance alone naming why."""
    from ..errors import ProviderError
    order = ("none", "maybe", "declared")
    use = "none"
    for rec in records:
        try:
            found = engine.registry.definition(rec).model_use()
        except ProviderError:  # a model that cannot be set up: refused, nothing run
            engine.close()
            raise
        except FsmError:
            continue
        use = max(use, found, key=order.index)
    return use


@app.command()
def step(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
         db: str = DB,
         llm: list[str] | None = typer.Option(None, "--llm", help="As for `fsm run` (repeatable)."),
         as_json: bool = typer.Option(False, "--json", help="Print the new record as JSON."),
         machines: list[str] = MACHINES) -> None:
    """Run exactly one step of an instance."""
    engine = _engine(db, llm=llm, create=False, machines=machines, models="deferred")
    instance_id = _find(engine.store, instance_id).id  # its machine's use builds the model

    async def go() -> Any:
        try:
            return await engine.step(instance_id)
        finally:
            await engine.aclose()
    import asyncio
    rec = asyncio.run(go())
    if as_json:
        from ..views import instance_json
        _print_json(instance_json(rec))
    else:
        out.print(f"{rec.id}: {rec.state} ({rec.status}) after {rec.loop_count} transitions")


