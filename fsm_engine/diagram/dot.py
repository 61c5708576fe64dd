"""Graphviz back end: :class:`~.model.Graph` -> DOT source, SVG or PNG.

Drawing rules:

* every state gets a safe node id (``s0``, ``s1`` ... in definition order); its
  name is only ever a label, escaped with :func:`graphviz.escape`, so spaces,
  quotes, backslashes, colons, ``<``/``>``/``&`` and non-ASCII names are safe;
* an invisible start point points at the initial state;
* final states are double circles; the failure state is red; wait states are
  dashed blue boxes; policy notes are extra label lines;
* fallback edges are dashed orange, budget edges dashed purple, runtime-forced
  edges dashed red;
* with an overlay: visited states are filled, the current state is bold and
  amber, taken edges are thicker with ``×N`` in the label, untaken edges grey,
  taken failure edges (into the failure state, or forced) thick red; a state's
  overlay figures (attempts, time, tokens) are extra label lines.

Output is deterministic: nodes in definition order, edges in first-declared
order, attributes sorted, no timestamps.
"""

from __future__ import annotations

import re
from pathlib import Path

import graphviz

from fsm_engine.errors import FsmError

from .mermaid import to_mermaid
from .model import Edge, Graph, Node, node_ids

_START = "__start__"
_RED, _ORANGE, _PURPLE, _BLUE = "#c0392b", "#e67e22", "#8e44ad", "#1f5fa8"
_GREY, _GREY_TEXT = "#b0b0b0", "#8a8a8a"

_NODE_STYLE: dict[str, dict[str, str]] = {
    "normal": {"shape": "box", "style": "rounded"},
    "initial": {"shape": "box", "style": "rounded"},
    "final": {"shape": "doublecircle"},
    "failure": {"shape": "doublecircle", "color": _RED, "fontcolor": _RED},
    "wait": {"shape": "box", "style": "rounded,dashed", "color": _BLUE, "fontcolor": _BLUE},
}
_EDGE_STYLE: dict[str, dict[str, str]] = {
    "normal": {},
    "fallback": {"style": "dashed", "color": _ORANGE, "fontcolor": _ORANGE},
    "budget": {"style": "dashed", "color": _PURPLE, "fontcolor": _PURPLE},
    "forced": {"style": "dashed", "color": _RED, "fontcolor": _RED},
}
_WRITERS = (".svg", ".png", ".dot", ".gv", ".mmd")


class GraphvizNotFound(FsmError):
    """The Graphviz ``dot`` program is not installed, so SVG/PNG cannot be drawn."""


def to_dot(graph: Graph) -> str:
    """Return the Graphviz DOT source of ``graph`` (same graph -> identical text)."""
    dot = graphviz.Digraph(
        name=_graph_id(graph.name),
        graph_attr={"rankdir": "LR", "labelloc": "t", "label": _graph_label(graph),
                    "fontname": "Helvetica"},
        node_attr={"fontname": "Helvetica", "fontsize": "11"},
        edge_attr={"fontname": "Helvetica", "fontsize": "10"},
    )
    ids = node_ids(graph)
    overlay = graph.overlay_id is not None
    for node in graph.nodes:
        if node.branches:
            _cluster(dot, ids[node.name], node, overlay)
        else:
            dot.node(ids[node.name], label=_node_label(node, overlay),
                     **_node_attrs(node, overlay))
    initial = graph.initial or _first_initial(graph)
    if initial in ids:
        dot.node(_START, label="", shape="point", style="invis", width="0.1")
        dot.edge(_START, ids[initial])
    for edge in graph.edges:
        dot.edge(ids[edge.source], ids[edge.dest], label=_edge_label(edge, overlay),
                 **_edge_attrs(edge, overlay))
    return dot.source


def _cluster(dot: graphviz.Digraph, sid: str, node: Node, overlay: bool) -> None:
    """A fan-out state as a cluster: the state itself, then each branch machine inside."""
    with dot.subgraph(name=f"cluster_{sid}") as outer:
        outer.attr(label="", style="rounded,dashed", color=_BLUE)
        outer.node(sid, label=_node_label(node, overlay), **_node_attrs(node, overlay))
        for i, (label, sub) in enumerate(node.branches):
            sub_ids = {name: f"{sid}_b{i}_{n}" for name, n in
                       ((nd.name, j) for j, nd in enumerate(sub.nodes))}
            with outer.subgraph(name=f"cluster_{sid}_b{i}") as inner:
                inner.attr(label=_lines([f"branch {label}"]), style="rounded", color=_GREY)
                for nd in sub.nodes:
                    inner.node(sub_ids[nd.name], label=_node_label(nd, False),
                               **_node_attrs(nd, False))
                for e in sub.edges:
                    inner.edge(sub_ids[e.source], sub_ids[e.dest], label=_edge_label(e, False),
                               **_edge_attrs(e, False))
            if sub.initial in sub_ids:
                outer.edge(sid, sub_ids[sub.initial], style="dotted", arrowhead="none",
                           color=_GREY)


def render(graph: Graph, path: str) -> None:
    """Write ``graph`` to ``path``; the extension picks the format.

    ``.svg`` and ``.png`` are drawn by Graphviz's ``dot`` program; ``.dot``
    (or ``.gv``) writes the DOT source and ``.mmd`` the Mermaid source, both
    UTF-8.  Missing parent folders are created (``output_file``).  Any other extension
    raises ValueError; a missing ``dot`` program raises :class:`GraphvizNotFound`.
    """
    target = Path(path)
    ext = target.suffix.lower()
    if ext not in _WRITERS:
        raise ValueError(f"cannot render diagram to {path!r}: unknown extension "
                         f"{ext or '(none)'!r}; use one of {', '.join(_WRITERS)}")
    output_file(path)
    if ext in (".dot", ".gv"):
        target.write_text(to_dot(graph), encoding="utf-8")
    elif ext == ".mmd":
        target.write_text(to_mermaid(graph), encoding="utf-8")
    else:
        target.write_bytes(pipe(to_dot(graph), ext[1:]))


def output_file(path: str) -> Path:
    """``path``, its missing parent folders created (every diagram writer: ``fsm diagram
    -o``, ``fsm coverage --diagram``, ``fsm test --diagram``); ``OSError`` when they
    cannot be."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def pipe(source: str, fmt: str) -> bytes:
    """Run ``dot -T<fmt>`` on DOT ``source`` and return the output bytes."""
    try:
        return graphviz.Source(source).pipe(format=fmt)
    except graphviz.ExecutableNotFound as exc:
        raise GraphvizNotFound(
            "the Graphviz 'dot' program is not installed (needed for .svg/.png); "
            "install it with 'apt-get install graphviz', or write .dot/.mmd instead") from exc


def _first_initial(graph: Graph) -> str | None:
    return next((n.name for n in graph.nodes if n.kind == "initial"), None)


def _graph_id(name: str) -> str:
    # A graph id is not a label, but dot copies it into SVG comments and <title>: keep
    # it to letters, digits and ``_`` (a name holding ``-->`` could end a comment early).
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "machine"


def _lines(lines: list[str]) -> str:
    """Escape each line and join them with DOT's centred line break.

    Backslashes are doubled (``\\N``, ``\\l`` ... would be escapes) and ``&`` becomes
    ``&amp;`` because dot decodes entities such as ``&amp;`` even in plain labels.
    """
    escaped = (graphviz.escape(line).replace("&", "&amp;") for line in lines)
    return graphviz.nohtml("\\n".join(escaped))


def _graph_label(graph: Graph) -> str:
    lines = [graph.name]
    if graph.title:
        lines.append(graph.title)
    elif graph.overlay_id or graph.status:
        lines.append(f"instance {graph.overlay_id}".strip()
                     + (f" ({graph.status})" if graph.status else ""))
    if graph.notes:
        lines.append(" · ".join(graph.notes))
    return _lines(lines)


def _node_label(node: Node, overlay: bool) -> str:
    lines = [node.name, *node.notes]
    if overlay and node.visits:
        lines.append(f"visited ×{node.visits}")
    if overlay:
        lines += node.figures
    return _lines(lines)


def _node_attrs(node: Node, overlay: bool) -> dict[str, str]:
    attrs = dict(_NODE_STYLE[node.kind])
    if not overlay:
        return attrs
    styles = [s for s in attrs.pop("style", "").split(",") if s]
    if node.visits or node.current:
        styles.append("filled")
        attrs["fillcolor"] = "#f8d7da" if node.kind == "failure" else "#dbeafe"
    else:
        attrs["fontcolor"] = _GREY_TEXT
    if node.current:
        styles.append("bold")
        attrs.update(penwidth="3", fillcolor="#f5b7b1" if node.kind == "failure" else "#fde68a")
        attrs.setdefault("color", "#b45309")
    if styles:
        attrs["style"] = ",".join(styles)
    return attrs


def _edge_label(edge: Edge, overlay: bool) -> str:
    label = f"{edge.label} ×{edge.taken}" if overlay and edge.taken else edge.label
    return _lines([label])


def _edge_attrs(edge: Edge, overlay: bool) -> dict[str, str]:
    attrs = dict(_EDGE_STYLE[edge.kind])
    if overlay and edge.taken and edge.failure:
        attrs.update(penwidth="3", color=_RED, fontcolor=_RED)
    elif overlay and edge.taken:
        attrs["penwidth"] = "2.5"
    elif overlay:
        attrs.update(color=_GREY, fontcolor=_GREY_TEXT)
    return attrs
