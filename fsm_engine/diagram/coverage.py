"""The coverage diagram (``fsm coverage --diagram``): a machine with what runs exercised.

Drawing rules, on top of :mod:`.dot`'s: a taken edge is solid with ``×N`` (its count);
an edge never taken is dashed red (``×0``); a state never entered has a dashed red
border; an edge whose guard was seen with one outcome only carries an extra line
``⚑ guard: only True (passed)`` (or ``False``, ``refused``: an ``unless`` guard ``!g``
passes on False; ``never evaluated`` for one not seen on a taken edge).
The caption gives the edge percentage and the instance count.  Output is deterministic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import graphviz

from ..coverage import Coverage, Edge, verdict
from .dot import _EDGE_STYLE, _NODE_STYLE, _RED, _graph_id, _lines, output_file, pipe
from .model import EdgeKind, build_graph, node_ids

__all__ = ["coverage_dot", "render_coverage"]


def _kind(edge: Edge) -> EdgeKind:
    if edge.trigger == "fallback":
        return "fallback"
    return "budget" if edge.trigger == "budget_exhausted" else "normal"


def _edge_lines(cov: Coverage, edge: Edge, taken: int) -> list[str]:
    lines = [f"{edge.trigger} [{', '.join(edge.guards)}] ×{taken}" if edge.guards
             else f"{edge.trigger} ×{taken}"]
    for guard in edge.guards:
        seen = +cov.guards.get((edge, guard), Counter())
        if len(seen) == 1:
            result = next(iter(seen))
            lines.append(f"⚑ {guard}: only {result} ({verdict(guard, result)})")
        elif not seen and taken:
            lines.append(f"⚑ {guard}: never evaluated")
    return lines


def coverage_dot(export: Mapping[str, Any], cov: Coverage) -> str:
    """DOT source of ``export`` overlaid with ``cov`` (same inputs -> identical text)."""
    graph = build_graph(export)  # nodes, kinds and notes as every diagram draws them
    caption = f"coverage {cov.percent:.0f} % of edges · {cov.instances} instance(s)"
    dot = graphviz.Digraph(
        name=_graph_id(graph.name),
        graph_attr={"rankdir": "LR", "labelloc": "t", "fontname": "Helvetica",
                    "label": _lines([graph.name, caption])},
        node_attr={"fontname": "Helvetica", "fontsize": "11"},
        edge_attr={"fontname": "Helvetica", "fontsize": "10"})
    ids = node_ids(graph)
    for node in graph.nodes:
        entered = cov.states.get(node.name, 0)
        attrs = dict(_NODE_STYLE[node.kind])
        if not entered:
            styles = [s for s in attrs.get("style", "").split(",") if s and s != "dashed"]
            attrs.update(style=",".join([*styles, "dashed"]), color=_RED, fontcolor=_RED)
        dot.node(ids[node.name], label=_lines([node.name, *node.notes, f"entered ×{entered}"]),
                 **attrs)
    if graph.initial is not None and graph.initial in ids:
        dot.node("__start__", label="", shape="point", style="invis", width="0.1")
        dot.edge("__start__", ids[graph.initial])
    for edge, taken in cov.edges.items():
        if edge.source not in ids or edge.dest not in ids:
            continue
        attrs = dict(_EDGE_STYLE[_kind(edge)])
        if taken:
            attrs.pop("style", None)
            attrs["penwidth"] = "2"
        else:
            attrs.update(style="dashed", color=_RED, fontcolor=_RED)
        dot.edge(ids[edge.source], ids[edge.dest], label=_lines(_edge_lines(cov, edge, taken)),
                 **attrs)
    return dot.source


def render_coverage(export: Mapping[str, Any], cov: Coverage, path: str) -> None:
    """Write the coverage diagram to ``path`` (``.svg``/``.png`` through Graphviz,
    ``.dot``/``.gv`` as source), its missing parent folders created; ValueError for another
    extension, ``GraphvizNotFound`` without ``dot``."""
    source = coverage_dot(export, cov)
    ext = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if ext in ("dot", "gv", "svg", "png"):
        output_file(path)
    if ext in ("dot", "gv"):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(source)
    elif ext in ("svg", "png"):
        with open(path, "wb") as fh:
            fh.write(pipe(source, ext))
    else:
        raise ValueError(f"cannot render a coverage diagram to {path!r}: use .svg, .png or .dot")
