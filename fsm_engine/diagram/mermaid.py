"""Mermaid back end: :class:`~.model.Graph` -> ``stateDiagram-v2`` text.

Mermaid state ids cannot hold spaces, quotes, colons or non-ASCII, so each
state gets a safe id (``s0``, ``s1`` ... as in the DOT output) and its name is
declared with ``state "name" as s0``.  Text is escaped with Mermaid entity
codes (``#58;`` for ``:``, ``#quot;`` for ``"`` ...), which Mermaid decodes
when it draws, so names and labels show exactly as written.

Mermaid cannot style single transitions in a state diagram, so edge kinds
show only in the label (runtime-forced moves get ``(forced)``); states are
styled with ``classDef``: ``failure``, ``wait`` and, with an overlay,
``visited`` and ``current``.  Policy notes become extra description lines.
"""

from __future__ import annotations

from .model import Edge, Graph, Node, node_ids

# One pass (str.translate), so the ``#`` and ``;`` of a code are never escaped again.
_ENTITIES = str.maketrans({"#": "#35;", ":": "#58;", ";": "#59;", '"': "#quot;",
                           "<": "#lt;", ">": "#gt;", "&": "#amp;", "`": "#96;"})

_CLASSES = {
    "failure": "stroke:#c0392b,color:#c0392b",
    "wait": "stroke:#1f5fa8,stroke-dasharray:5 5",
    "visited": "fill:#dbeafe",
    "current": "fill:#fde68a,stroke:#b45309,stroke-width:3px,font-weight:bold",
}


def to_mermaid(graph: Graph) -> str:
    """Return a Mermaid ``stateDiagram-v2`` for ``graph`` (same graph -> identical text)."""
    ids = node_ids(graph)
    overlay = graph.overlay_id is not None
    lines = ["stateDiagram-v2", f"    %% {_comment(graph)}", "    direction LR"]
    for node in graph.nodes:
        lines += _state_lines(ids[node.name], node, overlay)
    initial = graph.initial or next((n.name for n in graph.nodes if n.kind == "initial"), None)
    if initial in ids:
        lines.append(f"    [*] --> {ids[initial]}")
    lines += [_edge_line(ids, edge, overlay) for edge in graph.edges]
    lines += [f"    {ids[n.name]} --> [*]" for n in graph.nodes if n.kind in ("final", "failure")]
    lines += _class_lines(ids, graph.nodes, overlay)
    return "\n".join(lines) + "\n"


def escape(text: str) -> str:
    """Escape ``text`` for a Mermaid label or quoted state name (one line, entity codes)."""
    return " ".join(str(text).splitlines()).translate(_ENTITIES)


def _comment(graph: Graph) -> str:
    head = f"machine {graph.name}"
    if graph.overlay_id:
        head += f", instance {graph.overlay_id}"
    if graph.status:
        head += f" ({graph.status})"
    return escape(head)


def _state_lines(sid: str, node: Node, overlay: bool) -> list[str]:
    notes = list(node.notes)
    if overlay and node.visits:
        notes.append(f"visited ×{node.visits}")
    if overlay:
        notes += node.figures
    return [f'    state "{escape(node.name)}" as {sid}'] + [
        f"    {sid} : {escape(note)}" for note in notes]


def _edge_line(ids: dict[str, str], edge: Edge, overlay: bool) -> str:
    label = edge.label + (" (forced)" if edge.kind == "forced" else "")
    if overlay and edge.taken:
        label += f" ×{edge.taken}"
    return f"    {ids[edge.source]} --> {ids[edge.dest]} : {escape(label)}"


def _class_lines(ids: dict[str, str], nodes: tuple[Node, ...], overlay: bool) -> list[str]:
    """``classDef`` + ``class`` lines for each class some node uses, in a fixed order."""
    members: dict[str, list[str]] = {name: [] for name in _CLASSES}
    for node in nodes:
        if node.kind in ("failure", "wait"):
            members[node.kind].append(ids[node.name])
        if overlay and (node.visits or node.current):
            members["visited"].append(ids[node.name])
        if overlay and node.current:
            members["current"].append(ids[node.name])
    lines = []
    for name, sids in members.items():
        if sids:
            lines += [f"    classDef {name} {_CLASSES[name]}", f"    class {','.join(sids)} {name}"]
    return lines
