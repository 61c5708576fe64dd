"""The test kit's commands: ``fsm coverage``, ``fsm paths``, ``fsm test``, ``fsm export-test``.

``coverage`` and ``paths`` read a store (production or test) and the machine module;
``test`` runs the module's own cases on the virtual clock; ``export-test`` writes a pytest
file replaying one stored instance.  Bad input is one ``fsm: error:`` line, exit 2.
"""

from __future__ import annotations

from typing import Any

import typer

from ..terminal import shown
from .common import DB, _fail, _find, _open, _print_json, app, out

MODULE = typer.Argument(..., help="Machine module: path/to/file.py or dotted name.")
FAIL_UNDER = typer.Option(None, "--fail-under", min=0.0, max=100.0, metavar="PCT",
                          help="Exit 1 when fewer than PCT % of the edges were taken.")


def _machine(module: str) -> Any:
    from ..runtime import load_machine
    from ..runtime.compiled import compile_machine
    machine, _ = load_machine(module, named=True)
    compile_machine(machine)  # a broken definition: one error line, nothing read
    return machine


def _coverage_of(machine: Any, db: str | None) -> Any:
    """The coverage of ``machine`` in ``db``; an error line when it holds none of it."""
    from ..coverage import from_store
    store = _open(db)
    if not store.list(machine=machine.name):
        others = sorted({r.machine for r in store.list()})
        _fail(f"no instances of machine {machine.name!r} in the store"
              + (f" (it holds {', '.join(map(repr, others))})" if others else " (it is empty)"))
    return from_store(store, machine.export())


def print_coverage(cov: Any) -> None:
    """The coverage table: totals, then edges, what is missing, guards and exits."""
    taken = sum(1 for n in cov.edges.values() if n)
    reached = sum(1 for n in cov.states.values() if n)
    out.print(shown(f"machine {cov.machine}: {cov.instances} instance(s); edges {taken}/"
                    f"{len(cov.edges)} ({cov.percent:.1f} %), states {reached}/"
                    f"{len(cov.states)}"), highlight=False)
    width = max((len(e.label) for e in cov.edges), default=10)
    for edge, n in cov.edges.items():
        out.print(shown(f"  {edge.label:<{width}}  {n:>6}" + ("" if n else "  never taken")),
                  highlight=False)
    lines = [f"unreached state: {s}" for s, n in cov.states.items() if not n]
    from ..coverage import verdict
    lines += [f"one-sided guard: {g} only {r} ({verdict(g, r)}) on {e.label}"
              for e, g, r in cov.one_sided()]
    lines += [f"policy exit: {s} {x} ×{n}" for (s, x), n in sorted(cov.exits.items())]
    lines += [f"policy exit never seen: {s} {x}" for s, x in sorted(cov.possible)
              if not cov.exits[(s, x)]]
    lines += [f"forced move: {s} --{t}--> {d} ×{n}" for (s, d, t), n in sorted(cov.forced.items())]
    for line in lines:
        out.print(shown("  " + line), highlight=False)


def finish_coverage(cov: Any, export: Any, as_json: bool, fail_under: float | None,
                    diagram: str | None) -> None:
    """Print ``cov`` (table or JSON), draw it when asked; exit 1 under ``fail_under``."""
    if as_json:
        _print_json(cov.to_json())
    else:
        print_coverage(cov)
    if diagram:
        from ..diagram.coverage import render_coverage
        try:
            render_coverage(export, cov, diagram)
        except (ValueError, OSError) as exc:
            _fail(str(exc).splitlines()[0])
        if not as_json:
            out.print(shown(f"wrote {diagram}"), highlight=False)
    if fail_under is not None and cov.percent < fail_under:
        typer.echo(f"fsm: coverage {cov.percent:.1f} % of edges is under --fail-under "
                   f"{fail_under:g} %", err=True)
        raise typer.Exit(1)


@app.command()
def coverage(module: str = MODULE, db: str = DB,
             as_json: bool = typer.Option(False, "--json", help="JSON instead of the table."),
             fail_under: float | None = FAIL_UNDER,
             diagram: str | None = typer.Option(None, "--diagram", metavar="OUT",
                                                help="Draw the coverage: .svg, .png or .dot.")
             ) -> None:
    """Which states, edges, guard outcomes and policy exits the instances of a machine in a
    store have exercised (production or test)."""
    machine = _machine(module)
    finish_coverage(_coverage_of(machine, db), machine.export(), as_json, fail_under, diagram)


@app.command()
def paths(module: str = MODULE, db: str | None = typer.Option(
              None, "--db", help="Store whose instances mark the paths seen (default: none)."),
          loops: int = typer.Option(0, "--loops", min=0, help="Each cycle at most K times."),
          limit: int = typer.Option(1000, "--limit", min=1, help="List at most N paths."),
          as_json: bool = typer.Option(False, "--json", help="JSON instead of lines.")) -> None:
    """The paths from the initial state to each final state, each with how many instances
    took it (with --db)."""
    from ..paths import paths as find_paths
    from ..paths import states
    machine = _machine(module)
    cov = _coverage_of(machine, db) if db else None
    found = find_paths(machine.export(), loops=loops, limit=limit, coverage=cov)
    if as_json:
        _print_json(found.to_json())
        return
    for path, n in zip(found.found, found.seen, strict=True):
        mark = "" if cov is None else (f"  seen ×{n}" if n else "  never seen")
        out.print(shown(" -> ".join(states(path)) + mark), highlight=False)
    out.print(shown(f"{len(found.found)} path(s)" + (f" (stopped at --limit {limit})"
                                                     if found.truncated else "")),
              highlight=False)


@app.command(name="test")
def test_cases(module: str = MODULE,
               fail_under: float | None = FAIL_UNDER,
               as_json: bool = typer.Option(False, "--json", help="JSON coverage."),
               diagram: str | None = typer.Option(None, "--diagram", metavar="OUT",
                                                  help="Draw the coverage: .svg, .png or .dot.")
               ) -> None:
    """Run the machine's example cases (``CASES`` in the module, or a sibling
    ``*_cases.jsonl``) on the virtual clock; print each outcome and the coverage.  Exit 1
    on a failed case or coverage under --fail-under."""
    from ..testing.cases import cases_of, run_cases
    machine = _machine(module)
    cases = cases_of(module, machine)
    results, cov = run_cases(machine, cases)
    failed = 0
    for result in results:
        failed += not result.ok
        line = f"{'ok  ' if result.ok else 'FAIL'} {result.name}: {' -> '.join(result.path)}"
        typer.echo(shown(line), err=as_json)
        for problem in result.problems:
            typer.echo(shown(f"     {problem}"), err=as_json)
    code = 0
    if failed:
        typer.echo(f"fsm: {failed} of {len(results)} case(s) failed", err=True)
        code = 1
    try:
        finish_coverage(cov, machine.export(), as_json, fail_under, diagram)
    except typer.Exit as exc:
        code = max(code, exc.exit_code)
    raise typer.Exit(code)


@app.command(name="export-test")
def export_test(instance_id: str = typer.Argument(..., metavar="ID", help="Instance id (or prefix)."),
                output: str = typer.Option(..., "-o", "--output", help="The pytest file to write."),
                module: str | None = typer.Option(
                    None, "--machine", help="Machine module (default: the one the instance names)."),
                db: str = DB) -> None:
    """Write a self-contained pytest file replaying a stored instance — its input, recorded
    model replies, failed attempts and review decisions — on the virtual clock, asserting
    the same path, final state and output fields."""
    from ..runtime.loader import Trust
    from ..testing.export import case_from_store, write_test
    store = _open(db)
    rec = _find(store, instance_id)
    if module is None:  # the row names it: data, so only a module under the machines root
        Trust().check(rec.module, rec.id)
    case = case_from_store(store, rec)
    write_test(output, case, module or rec.module)
    out.print(shown(f"wrote {output} ({len(case['moves'])} transitions, "
                    f"{len(case['replies'])} recorded replies)"), highlight=False)
