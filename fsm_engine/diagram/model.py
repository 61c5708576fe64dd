"""The diagram model: a machine export (plus an optional instance overlay) as a small graph.

:func:`build_graph` turns the plain-dict export of a machine definition into a
:class:`Graph` of frozen :class:`Node` and :class:`Edge` values.  The renderers
(:mod:`.dot`, :mod:`.mermaid`) only ever read this model, so every drawing rule
that depends on the definition lives here, once.

Overlay rules (one instance's history drawn over its definition):

* ``Node.visits`` counts history rows entering the state, plus 1 for the
  initial state (the instance starts there).
* ``Edge.taken`` counts history rows matching the edge's (source, trigger,
  dest).  When several declared edges match (same move, different guards),
  the first one in definition order gets the count.
* A history row that matches no declared edge (a runtime-forced move such as
  ``fail``, ``cancel`` or ``loop_limit``) becomes an extra edge of kind
  ``"forced"``, labelled with its trigger.
* A state named in the history or as the current state but absent from the
  export becomes an extra node with the note ``"not in definition"``.

Aggregate overlays (many instances, ``fsm diagram --stats`` and the viewer's
machine page) give ``moves`` — ``{source, dest, trigger, count}`` — instead of
(or as well as) ``history``; each counts ``count`` times.  ``starts`` is how
many times the initial state was entered at creation (default 1).  Any overlay
may give ``figures``: per state name, extra label lines (attempts, time,
tokens); ``title`` replaces the ``instance …`` caption.  Edges into a failure
state and runtime-forced edges are ``failure`` edges, highlighted when taken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..definition.kind import KINDS

NodeKind = Literal["normal", "initial", "final", "failure", "wait"]
EdgeKind = Literal["normal", "fallback", "budget", "forced"]

FALLBACK_TRIGGER = "fallback"
BUDGET_TRIGGER = "budget_exhausted"


@dataclass(frozen=True)
class Node:
    """One state: its name, drawing kind, overlay visits and policy notes."""

    name: str
    kind: NodeKind = "normal"
    visits: int = 0
    current: bool = False
    notes: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()
    #: A fan-out state's branch machines: (branch label, its graph), drawn inside its cluster.
    branches: tuple[tuple[str, Graph], ...] = ()


@dataclass(frozen=True)
class Edge:
    """One drawn transition; ``label`` is the trigger and its guards, ``taken`` the overlay
    count; ``failure`` marks an edge into a failure state or a runtime-forced one."""

    source: str
    dest: str
    label: str
    kind: EdgeKind = "normal"
    taken: int = 0
    failure: bool = False


@dataclass(frozen=True)
class Graph:
    """A machine (optionally one instance of it) ready to be rendered.

    ``overlay_id`` is the instance id when an overlay was given ("" if it has
    none), else None: renderers draw overlay styling when it is not None.
    ``initial`` names the initial state (the start arrow points at it even
    when its kind is ``wait``); ``status`` is the overlay's instance status;
    ``notes`` holds machine-wide limits (transition limit, token budget).
    """

    name: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    overlay_id: str | None = None
    initial: str | None = None
    status: str | None = None
    notes: tuple[str, ...] = ()
    title: str | None = None

    def node(self, name: str) -> Node:
        """Return the node called ``name`` (KeyError if there is none)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


def node_ids(graph: Graph) -> dict[str, str]:
    """Map each state name to a safe renderer id: ``s0``, ``s1`` ... in node order."""
    return {node.name: f"s{i}" for i, node in enumerate(graph.nodes)}


# A declared move: (source, dest, trigger, guards) where guards are already rendered.
_EdgeKey = tuple[str, str, str, tuple[str, ...]]


def build_graph(export: Mapping[str, Any], overlay: Mapping[str, Any] | None = None) -> Graph:
    """Build a :class:`Graph` from a machine export and, optionally, one instance's overlay.

    Parallel transitions with the same (source, dest, trigger, guards) are
    merged into one edge; nodes keep definition order and edges keep the
    order of their first declaration, so equal input gives an equal graph.
    """
    initial = export["initial"]
    keys = _edge_keys(export.get("transitions", ()))
    history = _moves(overlay)
    taken, forced = _count_moves(keys, history)
    nodes = _nodes(export, initial, overlay, history)
    failing = {n.name for n in nodes if n.kind == "failure"}
    delays = _delays(export.get("transitions", ()))
    edges = [_declared_edge(key, taken[key], key[1] in failing, delays.get((key[0], key[2])))
             for key in keys]
    edges += [Edge(src, dst, trig, "forced", n, True) for (src, dst, trig), n in forced]
    return Graph(
        name=str(export.get("name", "machine")),
        nodes=tuple(nodes),
        edges=tuple(edges),
        overlay_id=str(overlay.get("instance_id") or "") if overlay is not None else None,
        initial=initial,
        status=_opt_str(overlay.get("status")) if overlay is not None else None,
        notes=_machine_notes(export),
        title=_opt_str(overlay.get("title")) if overlay is not None else None,
    )


def state_notes(state: Mapping[str, Any]) -> tuple[str, ...]:
    """Compact policy notes for one exported state, e.g. ``("retry×3", "timeout 30s")``."""
    notes: list[str] = []
    if state.get("llm"):
        notes.append(f"model {state['llm']}" + (f", repair {state['repair_llm']}"
                                                if state.get("repair_llm") else ""))
    for kind in KINDS:  # wait, fan-out, agent, a plug-in's own note (``definition.kind``)
        notes += kind.notes(state)
    retry = state.get("retry")
    if retry:
        attempts = retry.get("max_attempts") if isinstance(retry, Mapping) else None
        notes.append(f"retry×{attempts}" if attempts is not None else "retry")
    if state.get("timeout") is not None:
        notes.append(f"timeout {float(state['timeout']):g}s")
    if state.get("queue"):
        notes.append(f"queue {state['queue']}")
    if state.get("fallback"):
        notes.append(f"fallback → {state['fallback']}")
    notes += [label for key, label in _FLAG_NOTES if state.get(key)]
    return tuple(notes)


_FLAG_NOTES = (("side_effect", "side effect"), ("skippable", "skippable"))


def node_kind(state: Mapping[str, Any], initial: str) -> NodeKind:
    """The drawing kind of an exported state: failure > final > wait > initial > normal."""
    if state.get("final") and state.get("failure"):
        return "failure"
    if state.get("final"):
        return "final"
    if state.get("wait"):
        return "wait"
    return "initial" if state["name"] == initial else "normal"


def _edge_keys(transitions: Sequence[Mapping[str, Any]]) -> list[_EdgeKey]:
    """Distinct (source, dest, trigger, guards) keys in first-declared order."""
    keys: dict[_EdgeKey, None] = {}
    for t in transitions:
        guards = tuple(str(c) for c in t.get("conditions") or ())
        guards += tuple(f"!{u}" for u in t.get("unless") or ())
        keys.setdefault((str(t["source"]), str(t["dest"]), str(t["trigger"]), guards), None)
    return list(keys)


def _edge_kind(trigger: str) -> EdgeKind:
    if trigger == FALLBACK_TRIGGER:
        return "fallback"
    return "budget" if trigger == BUDGET_TRIGGER else "normal"


def _delays(transitions: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(source, trigger) -> the delay's text (``after 1h``) of each timer edge."""
    from ..definition.timers import label
    out: dict[tuple[str, str], str] = {}
    for t in transitions:
        after = t.get("after")
        if after is not None:
            text = after.partition(":")[2] + "()" if isinstance(after, str) else label(after)
            out.setdefault((str(t["source"]), str(t["trigger"])), f"after {text}")
    return out


def _declared_edge(key: _EdgeKey, taken: int, failure: bool, delay: str | None = None) -> Edge:
    """The edge of ``key``; ``delay``: a timer's (``after 1h``), shown after its trigger."""
    source, dest, trigger, guards = key
    shown = trigger if delay is None else f"{trigger} ⏱ {delay}"
    label = f"{shown} [{', '.join(guards)}]" if guards else shown  # ok [valid, !too_long]
    return Edge(source, dest, label, _edge_kind(trigger), taken, failure)


def _count_moves(keys: list[_EdgeKey], history: list[Mapping[str, Any]]
                 ) -> tuple[Counter[_EdgeKey], list[tuple[tuple[str, str, str], int]]]:
    """Count history rows per declared edge; rows matching none are forced moves."""
    first: dict[tuple[str, str, str], _EdgeKey] = {}
    for key in keys:
        first.setdefault(key[:3], key)
    taken: Counter[_EdgeKey] = Counter()
    forced: Counter[tuple[str, str, str]] = Counter()
    for row in history:
        move = (str(row["source"]), str(row["dest"]), str(row.get("trigger", "")))
        weight = int(row.get("count", 1))
        if move in first:
            taken[first[move]] += weight
        else:
            forced[move] += weight
    return taken, sorted(forced.items())


def _nodes(export: Mapping[str, Any], initial: str, overlay: Mapping[str, Any] | None,
           history: list[Mapping[str, Any]]) -> list[Node]:
    """Definition states in order, then any state only the overlay mentions."""
    visits: Counter[str] = Counter()
    for row in history:
        visits[str(row["dest"])] += int(row.get("count", 1))
    if overlay is not None:
        visits[initial] += int(overlay.get("starts", 1))
    current = _opt_str(overlay.get("state")) if overlay is not None else None
    figures = (overlay.get("figures") or {}) if overlay is not None else {}
    nodes = [Node(s["name"], node_kind(s, initial), visits[s["name"]],
                  s["name"] == current, state_notes(s),
                  tuple(map(str, figures.get(s["name"], ()))), _branches(s))
             for s in export["states"]]
    known = {n.name for n in nodes}
    extra = [str(row[end]) for row in history for end in ("source", "dest")]
    for name in dict.fromkeys(extra + ([current] if current else [])):
        if name not in known:
            nodes.append(Node(name, "normal", visits[name], name == current,
                              ("not in definition",), tuple(map(str, figures.get(name, ())))))
    return nodes


def _branches(state: Mapping[str, Any]) -> tuple[tuple[str, Graph], ...]:
    """A fan-out state's branch machines as graphs (a ``Map``'s one machine: ``each item``)."""
    fan = state.get("fan_out")
    if not fan:
        return ()
    return tuple((b["name"] or "each item", build_graph(b["machine"])) for b in fan["branches"])


def _moves(overlay: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The overlay's history rows and aggregate moves that record a move (rows without
    source or dest are skipped)."""
    if overlay is None:
        return []
    rows = [*(overlay.get("history") or ()), *(overlay.get("moves") or ())]
    return [r for r in rows if r.get("source") is not None and r.get("dest") is not None]


def _machine_notes(export: Mapping[str, Any]) -> tuple[str, ...]:
    notes = []
    if export.get("max_transitions") is not None:
        notes.append(f"≤{export['max_transitions']} transitions")
    if export.get("token_budget") is not None:
        notes.append(f"budget {export['token_budget']} tokens")
    return tuple(notes)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
