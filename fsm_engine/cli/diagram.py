"""``fsm diagram``: a machine's diagram, with an instance's path or every instance's figures."""

from __future__ import annotations

import typer

from .common import DB, _fail, _find, _open, app, out


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
    from ..diagram import build_graph, render, to_dot, to_mermaid
    from ..diagram.dot import output_file
    from ..runtime import load_machine
    if instance and stats:
        _fail("give --instance or --stats, not both")
    machine, _ = load_machine(module, named=True)
    from ..runtime.compiled import compile_machine
    compile_machine(machine)
    overlay = None
    if instance:
        from ..diagram.overlays import instance_overlay
        store = _open(db)
        rec = _find(store, instance)
        if rec.machine != machine.name:
            _fail(f"instance {rec.id} belongs to machine {rec.machine!r}, not {machine.name!r}")
        overlay = instance_overlay(rec, store.history(rec.id), store.attempts(rec.id))
    elif stats:
        from ..diagram.overlays import aggregate_overlay
        from ..stats import machine_stats
        from ..store.records import InstanceFilter
        figures = machine_stats(_open(db), InstanceFilter(machine=machine.name))
        if machine.name not in figures:
            _fail(f"no instances of machine {machine.name!r} in {db}")
        overlay = aggregate_overlay(figures[machine.name])
    graph = build_graph(machine.export(), overlay)
    if not output:
        typer.echo(to_mermaid(graph) if mermaid else to_dot(graph))
        return
    try:
        if mermaid:  # Mermaid text whatever the file's extension
            output_file(output).write_text(to_mermaid(graph), encoding="utf-8")
        else:
            render(graph, output)
    except (ValueError, RuntimeError, OSError) as exc:
        _fail(str(exc).splitlines()[0])
    out.print(f"wrote {output}")
