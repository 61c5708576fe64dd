"""``fsm worker`` / ``start`` / ``wait`` / ``workers``: running work on many processes and hosts.

A thin layer over ``runtime.worker.Worker`` and the store, registered on the
``fsm`` app by ``cli.py``.  ``wait`` exits as ``fsm run`` does: 0 when every
instance completed, 1 when one failed or was cancelled, 3 when one is not final
(waiting for an event) or ``--timeout`` passed first; 2 for a user error.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..store.records import WAITING
from ..terminal import console, safe_logging, shown
from ..views import instance_json
from .common import DB, _fail, _find, _input_for, _open, app, out

if TYPE_CHECKING:
    from ..store import Store

#: ``fsm wait`` exit status when its timeout passed before every instance was final.
EXIT_TIMEOUT = 3


def _ids(store: Store, given: list[str]) -> list[str]:
    return [_find(store, i).id for i in given]


def _settled(rec: Any) -> bool:
    return rec.final or rec.status == WAITING


def follow(store: Store, ids: list[str], *, timeout: float | None, quiet: bool,
           interval: float = 0.2) -> tuple[list[Any], bool]:
    """Poll ``ids`` until each is final or waiting (or ``timeout`` seconds pass), with a
    progress bar on a terminal; returns the last records and whether all settled."""
    end = None if timeout is None else time.monotonic() + timeout
    latest: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console(stderr=True),
                  disable=quiet or not sys.stderr.isatty()) as bar:
        task = bar.add_task("waiting", total=len(ids))
        while True:
            todo = [i for i in ids if i not in latest or not _settled(latest[i])]
            if len(todo) > 50:
                wanted = set(todo)
                latest.update((r.id, r) for r in store.list() if r.id in wanted)
            else:
                latest.update((i, store.get(i)) for i in todo)
            done = sum(1 for i in ids if _settled(latest[i]))
            bar.update(task, completed=done)
            if done == len(ids):
                return [latest[i] for i in ids], True
            if end is not None and time.monotonic() >= end:
                return [latest[i] for i in ids], False
            time.sleep(interval)


def _exit_for(records: list[Any], settled: bool, as_json: bool,
              hint: str | None = None) -> None:
    from .common import _print_json, exit_code
    if as_json:
        _print_json([instance_json(r) for r in records])
    else:
        from .tables import print_records
        print_records(out, records)
        if hint:
            out.print(hint, highlight=False, soft_wrap=True, markup=False)
    if not settled:
        from collections import Counter
        left = Counter(r.status for r in records if not _settled(r))
        typer.echo("fsm: timed out with " + ", ".join(
            f"{n} {shown(status)}" for status, n in sorted(left.items())) + " (not final yet)",
            err=True)
        raise typer.Exit(EXIT_TIMEOUT)
    raise typer.Exit(exit_code(records))


def _live_workers(store: Store) -> int:
    from ..runtime.fleet.liveness import live_ids
    return len(live_ids(store.workers(), time.time(), 10.0))


def enqueue_and_wait(db: str | None, machine: Any, ref: str, inputs: list[dict[str, Any]], *,
                     budget: int | None, deadline: float | None, as_json: bool,
                     quiet: bool) -> list[Any]:
    """``fsm run`` on a shared store: enqueue for the workers, then follow to the end;
    the final records (the caller prints them as a local run's)."""
    from ..runtime import Engine
    engine = Engine(_open(db, create=True))
    try:
        engine.register(machine, ref)
        ids = engine.start_many(machine, inputs, token_budget=budget, deadline_s=deadline,
                                enqueue=True)
        if not _live_workers(engine.store):
            typer.echo("fsm: no live worker on this store yet: start `fsm worker --db URL` "
                       "(or use --local)", err=True)
        records, settled = follow(engine.store, ids, timeout=None, quiet=quiet)
    finally:
        engine.close()
    if not settled:  # timed out (never without a timeout): exit 3 as `fsm wait` does
        from .observe import viewer_hint
        _exit_for(records, settled, as_json, None if quiet else viewer_hint(db))
    return records


@app.command()
def start(module: str = typer.Argument(..., help="Machine module: path/to/file.py or dotted name."),
          more: list[str] | None = typer.Argument(None, metavar="[FILE]...",
                                                     help="More input files."),
          input: list[str] = typer.Option([], "--input", "-i", help="Input file(s)."),
          db: str | None = DB,
          budget: int | None = typer.Option(None, "--budget", min=1,
                                               help="Token budget per instance."),
          deadline: float | None = typer.Option(None, "--deadline", min=0.001,
                                                   help="Seconds each instance may take in all."),
          partition: str | None = typer.Option(
              None, "--partition", help="Partition key (e.g. a tenant id): see "
                                        "`fsm worker --partition-limit`."),
          key: str | None = typer.Option(
              None, "--key", help="Idempotency key: a second start with it prints the "
                                  "first instance's id and starts nothing."),
          delay: str | None = typer.Option(None, "--in", help="Start later: 90s, 10m, 2h …"),
          at: str | None = typer.Option(None, "--at", help="Start at this ISO time, with its "
                                                         "zone (2030-01-01T09:00+01:00)."),
          priority: int = typer.Option(0, "--priority", help="Higher is claimed first "
                                                              "(-1000…1000; aging: 60 s a step)."),
          debounce_key: str | None = typer.Option(
              None, "--debounce-key", help="Collapse starts with this key into one."),
          debounce: str | None = typer.Option(None, "--debounce", help="… started this "
                                              "long after the latest start (30s)."),
          max_wait: str | None = typer.Option(None, "--max-wait", help="… but no later than "
                                              "this after the first (5m).")
          ) -> None:
    """Enqueue one instance per input for `fsm worker`s; print their ids (one a line)."""
    from .when import start_options
    opts = start_options(key=key, delay=delay, at=at, priority=priority,  # the flags first:
                         debounce_key=debounce_key, debounce=debounce,     # a bad one is named
                         max_wait=max_wait)                                # before a missing input
    files = list(input) + list(more or [])
    if not files:
        _fail("give at least one --input FILE")
    inputs = [_input_for(f) for f in files]
    from ..runtime import Engine, load_machine
    from ..runtime.compiled import compile_machine
    machine, ref = load_machine(module, named=True)
    compile_machine(machine)  # a broken module creates nothing
    engine = Engine(_open(db, create=True))
    try:
        engine.register(machine, ref)
        ids = engine.start_many(machine, inputs, token_budget=budget, deadline_s=deadline,
                                enqueue=True, partition=partition, options=opts)
    finally:
        engine.close()
    for iid in ids:
        typer.echo(iid)


@app.command()
def wait(ids: list[str] = typer.Argument(..., help="Instance ids (unambiguous prefixes work)."),
         db: str | None = DB,
         timeout: float | None = typer.Option(None, "--timeout", min=0.0,
                                                 help="Give up after this many seconds (exit 3)."),
         as_json: bool = typer.Option(False, "--json", help="Print the final records as JSON."),
         quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar.")) -> None:
    """Follow instances until each is final; exit 0 all completed, 1 otherwise, 3 timed out."""
    store = _open(db)
    try:
        records, settled = follow(store, _ids(store, ids), timeout=timeout, quiet=quiet)
    finally:
        store.close()
    _exit_for(records, settled, as_json)


def _profiled(fn: Callable[[], None]) -> None:
    """``fn()``, under cProfile when ``FSM_PROFILE`` names a file prefix (the stats go to
    ``PREFIX.PID``, read with ``python -m pstats``)."""
    prefix = os.environ.get("FSM_PROFILE")
    if not prefix:
        fn()
        return
    import cProfile
    prof = cProfile.Profile()
    try:
        prof.runcall(fn)
    finally:
        prof.dump_stats(f"{prefix}.{os.getpid()}")


@app.command()
def worker(db: str | None = DB,
           concurrency: list[str] = typer.Option(
               ["32"], "--concurrency", metavar="N|QUEUE=N,…",
               help="Most instances stepping at once here (N), and per queue (llm=4,io=32)."),
           queue: list[str] = typer.Option([], "--queue", "-q",
                                           help="Only claim from this queue (repeatable)."),
           queue_limit: list[str] = typer.Option(
               [], "--queue-limit", metavar="QUEUE=N,…",
               help="Most instances of a queue at once over ALL workers (through the store)."),
           partition_limit: int | None = typer.Option(
               None, "--partition-limit", min=1, max=1_000_000,  # runtime.fleet.queues.MAX_COUNT
               help="Most instances of one partition key at once over all workers."),
           rate_limit: list[str] = typer.Option(
               [], "--rate-limit", metavar="MODEL=rpm:N,tpm:N[,window:S]",
               help="A model's shared rate limit (MODEL: a --llm name, or default)."),
           machines: list[str] = typer.Option([], "--machines", "-m",
                                              help="Only run these machine modules (loaded now)."),
           llm: list[str] | None = typer.Option(None, "--llm", help="As for `fsm run` (repeatable)."),
           lease: float = typer.Option(5.0, "--lease", min=0.3,
                                       help="Lease seconds (renewed every third of it)."),
           grace: float = typer.Option(10.0, "--grace", min=0.0,
                                       help="Seconds SIGTERM lets in-flight steps finish."),
           poll: float = typer.Option(1.0, "--poll", min=0.01,
                                      help="Most seconds between claims while idle."),
           schedules: bool = typer.Option(True, "--schedules/--no-schedules",
                                          help="Fire the store's due schedule ticks "
                                               "(`fsm schedule`).")) -> None:
    """Claim and run instances from the store until SIGTERM (then drain and exit 0)."""
    from ..runtime.worker import Worker
    safe_logging("fsm worker: %(levelname)s %(message)s")  # no credential, no control code
    from ..llm.select import providers_from_specs
    from ..runtime import Engine
    plan = _plan(concurrency, queue, queue_limit, partition_limit)
    from ..runtime.fleet.rates import limits_from_specs
    limits = limits_from_specs(rate_limit)
    store = _open(db, create=True)  # first: a bad store URL is the error to report
    engine = Engine(store, lease_seconds=lease, rate_limits=limits)

    def build(use: str) -> Any:  # when the first machine that may call a model comes
        providers = providers_from_specs(llm, lazy=use == "maybe" and not llm)
        named = "; ".join(k if n == "*" else f"{n} = {k}"
                          for n, k in _keys(providers).items())
        typer.echo(shown(f"fsm worker {engine.worker.id}: llm: {named}"), err=True)
        return providers
    engine.models.defer(build)  # a worker of ctx-only machines sets up no model
    names = None
    if machines:
        names = [engine.load(m).spec.name for m in machines]
    runner = Worker(engine, machines=names, poll=poll, grace=grace, plan=plan,
                    schedules=schedules)
    from .. import collector
    collector.tune_if_owned()  # a long-lived process of ours: see fsm_engine.collector
    import asyncio

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runner.stop)
        # said once SIGTERM drains: said before, a SIGTERM sent as soon as it was read (a
        # supervisor, the matrix harness under load) could end the process at once (-15)
        typer.echo(f"fsm worker {engine.worker.id} on {engine.store.url}", err=True)
        try:
            await runner.serve()
        finally:
            await engine.aclose()
    _profiled(lambda: asyncio.run(serve()))
    typer.echo(f"fsm worker {engine.worker.id} stopped ({runner.completed} completed)", err=True)


def _keys(providers: dict[str, Any]) -> dict[str, str]:
    from ..runtime.model_registry import model_key
    return {name: model_key(p) for name, p in providers.items()}


def _plan(concurrency: list[str], queues: list[str], limits: list[str],
          partition_limit: int | None) -> Any:
    """The worker's ``QueuePlan`` from its options (``InvalidInput`` for a bad one)."""
    from ..runtime.fleet.queues import QueuePlan, check_queue, parse_counts
    total, per_queue = parse_counts(concurrency, "--concurrency")
    bare, global_limits = parse_counts(limits, "--queue-limit")
    if bare is not None:
        _fail("--queue-limit takes QUEUE=N (a total over all workers per queue)")
    serve = tuple(dict.fromkeys(check_queue(q) for q in queues)) or None
    return QueuePlan(total=total or max([32, *per_queue.values()]), serve=serve,
                     per_queue=per_queue, global_limits=global_limits,
                     partition_limit=partition_limit)


@app.command()
def workers(db: str | None = DB,
            as_json: bool = typer.Option(False, "--json", help="Print the workers as JSON.")) -> None:
    """List registered workers: host, pid, queues, heartbeat age, lease left, instances held."""
    store = _open(db)
    try:
        now = time.time()
        rows: list[dict[str, Any]] = []
        for w in sorted(store.workers(), key=lambda w: w.started_at):
            until = w.lease_until if w.lease_until is not None else w.heartbeat_at + 10.0
            rows.append({"id": w.id, "host": w.host, "pid": w.pid, "queues": w.queues,
                         "heartbeat_age_s": round(now - w.heartbeat_at, 3),
                         "lease_left_s": round(until - now, 3), "alive": until >= now,
                         "held": len(store.held(w.id))})
    finally:
        store.close()
    if as_json:
        from .common import _print_json
        _print_json(rows)
        return
    table = Table(title="workers")
    for col in ("worker", "host", "pid", "queues", "heartbeat age", "lease left", "held"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["host"], str(r["pid"]), ",".join(r["queues"]) or "(all)",
                      f"{r['heartbeat_age_s']:.1f}s",
                      f"{r['lease_left_s']:.1f}s" if r["alive"] else "expired", str(r["held"]))
    out.print(table)


__all__ = ["follow", "enqueue_and_wait", "EXIT_TIMEOUT"]
