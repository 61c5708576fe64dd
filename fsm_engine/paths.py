"""The paths of a machine (``fsm paths``): from the initial state to each final state.

A path is a sequence of declared edges (``coverage.Edge``; two edges between the same
states under different triggers or guards make two paths).  Loops are bounded: a path
enters each state at most ``loops + 1`` times, so ``loops=0`` lists the simple paths and
``loops=1`` lets every cycle run once more.  At most ``limit`` paths are listed (depth
first, in declaration order); ``Paths.truncated`` says when more exist.  Fan-out branch
machines are not entered (a fan-out state is one step of its parent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .coverage import Coverage, Edge, _Plan

__all__ = ["Paths", "paths"]


@dataclass
class Paths:
    """The paths found, each with how many instances took it exactly (``seen``)."""

    found: list[tuple[Edge, ...]] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        """``{"paths": [{"states", "triggers", "final", "seen"}], "truncated"}``."""
        return {"truncated": self.truncated, "paths": [
            {"states": states(p), "triggers": [e.trigger for e in p], "final": p[-1].dest,
             "seen": n} for p, n in zip(self.found, self.seen, strict=True)]}


def states(path: tuple[Edge, ...]) -> list[str]:
    """The states a path goes through, from the initial one."""
    return [path[0].source, *(e.dest for e in path)] if path else []


def paths(export: Mapping[str, Any], *, loops: int = 0, limit: int = 1000,
          coverage: Coverage | None = None) -> Paths:
    """The paths of ``export`` (see the module docstring); ``coverage``: whose instances'
    paths count as seen.  Raises ``ValueError`` for ``loops`` < 0 or ``limit`` < 1."""
    if loops < 0 or limit < 1:
        raise ValueError("loops must be >= 0 and limit >= 1")
    plan = _Plan(export)
    finals = {str(s["name"]) for s in export.get("states", ()) if s.get("final")}
    out = Paths()
    initial = str(export.get("initial"))
    visits: Counter[str] = Counter({initial: 1})
    stack: list[Edge] = []

    def walk(state: str) -> None:
        if len(out.found) >= limit:
            out.truncated = True
            return
        if state in finals:
            out.found.append(tuple(stack))
            return
        for edge in plan.by_source.get(state, []):
            if visits[edge.dest] > loops:
                continue
            visits[edge.dest] += 1
            stack.append(edge)
            walk(edge.dest)
            stack.pop()
            visits[edge.dest] -= 1
    walk(initial)
    taken = coverage.paths if coverage is not None else Counter()
    out.seen = [taken.get(p, 0) for p in out.found]
    return out
