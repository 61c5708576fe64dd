"""DAG workflows declared as steps with dependencies, compiled to states and fan-out states.

``dag(name, context, nodes=[Node("analyze_ui", fn), Node("suggest", fn2,
depends_on=["analyze_ui", "analyze_copy"]), …])`` orders the nodes in
topological layers (``graphlib``; a node's layer is one more than its deepest
dependency): a layer of one node becomes an ordinary state, a layer of several
a ``Parallel`` fan-out whose branches are the nodes' actions (each a child
instance), joined with ``merge_outputs`` (each action's updates merged into the
context).  Per node: ``retry``, ``timeout``, ``fallback`` (an action run when
the node fails for good) and ``skippable`` with ``default_output``, exactly as
on states.  A cycle, an unknown dependency or a duplicate name is a
``DefinitionError`` listing each.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..errors import DefinitionError
from ..policies import Completion, RetryPolicy
from .fanout import BRANCH_FAILED, JOINED, Branch, Parallel, merge_outputs
from .spec import Machine, Ref, State, Transition


@dataclass(frozen=True)
class Node:
    """One step of a DAG: an action (``fn(ctx)`` / ``fn(ctx, step)`` returning updates)
    run once the nodes it ``depends_on`` have finished."""

    name: str
    action: Ref
    depends_on: Sequence[str] = ()
    retry: RetryPolicy | None = None
    timeout: float | None = None
    fallback: Ref | None = None
    skippable: bool = False
    default_output: Mapping[str, Any] | None = None
    llm: str | None = None
    description: str = ""


def layers(nodes: Sequence[Node], machine: str = "dag") -> list[list[Node]]:
    """The nodes in topological layers (declaration order inside a layer); a
    ``DefinitionError`` listing every duplicate, unknown dependency and cycle."""
    problems: list[str] = []
    names = [n.name for n in nodes]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"node {name!r} is declared more than once")
    known = set(names)
    for n in nodes:
        for dep in n.depends_on:
            if dep not in known:
                problems.append(f"node {n.name!r} depends on unknown node {dep!r}")
    graph = {n.name: [d for d in n.depends_on if d in known] for n in nodes}
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        problems.append("dependency cycle: " + " -> ".join(map(str, exc.args[1])))
        order = []
    if not nodes:
        problems.append("a DAG needs at least one node")
    if problems:
        raise DefinitionError(machine, problems)
    depth: dict[str, int] = {}
    for name in order:
        depth[name] = 1 + max((depth[d] for d in graph[name]), default=-1)
    by_name = {n.name: n for n in nodes}
    out: list[list[Node]] = [[] for _ in range(max(depth.values()) + 1)]
    for name in names:
        out[depth[name]].append(by_name[name])
    return out


def _single(node: Node, nxt: str, states: list[State], transitions: list[Transition]) -> None:
    fallback = f"{node.name} (fallback)" if node.fallback is not None else None
    states.append(State(node.name, action=node.action, retry=node.retry, timeout=node.timeout,
                        fallback=fallback, skippable=node.skippable, llm=node.llm,
                        default_output=node.default_output, description=node.description))
    transitions.append(Transition("done", node.name, nxt))
    if fallback is not None:
        states.append(State(fallback, action=node.fallback, llm=node.llm))
        transitions.append(Transition("done", fallback, nxt))


def _branch(node: Node) -> Branch:
    return Branch(node.action, skippable=node.skippable, default_output=node.default_output,
                  retry=node.retry, timeout=node.timeout, fallback=node.fallback, llm=node.llm)


def dag(name: str, context: type[BaseModel], nodes: Sequence[Node], *,
        max_transitions: int = 100, token_budget: int | None = None,
        completion: Completion | str = "all_successful", description: str = "",
        namespace: Mapping[str, Any] | None = None) -> Machine:
    """A ``Machine`` running ``nodes`` layer by layer (independent nodes in parallel),
    ending in ``done`` (or ``failed``: a node that failed for good and is not skippable)."""
    if namespace is None:
        import inspect
        frame = inspect.currentframe()
        namespace = frame.f_back.f_globals if frame and frame.f_back else {}
    layered = layers(nodes, name)
    labels = [ly[0].name if len(ly) == 1 else " & ".join(n.name for n in ly) for ly in layered]
    states: list[State] = []
    transitions: list[Transition] = []
    for i, layer in enumerate(layered):
        nxt = labels[i + 1] if i + 1 < len(layered) else "done"
        if len(layer) == 1:
            _single(layer[0], nxt, states, transitions)
            continue
        states.append(State(labels[i], fan_out=Parallel(
            branches={n.name: _branch(n) for n in layer}, reducer=merge_outputs,
            completion=completion)))
        transitions += [Transition(JOINED, labels[i], nxt),
                        Transition(BRANCH_FAILED, labels[i], "failed")]
    states += [State("done", final=True), State("failed", final=True, failure=True)]
    return Machine(name=name, context=context, initial=labels[0], states=states,
                   transitions=transitions, max_transitions=max_transitions,
                   token_budget=token_budget, description=description, namespace=namespace)
