"""Overlays for :func:`~.model.build_graph`: one instance's path with per-state figures,
or many instances' aggregate (``fsm diagram --instance/--stats`` and the viewer).

Both return the plain overlay dict ``build_graph`` reads (see :mod:`.model`).
Figures are short label lines: ``2 attempts``, ``1.2 s``, ``340 tok``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..store import details
from ..store.records import NOT_MOVES, RECOVERY, TOOL, AttemptRow, HistoryRow, InstanceRecord

if TYPE_CHECKING:
    from ..stats import MachineStats


def seconds(value: float | None) -> str:
    """``0.42 s``, ``12.3 s``, ``4.1 min``, ``2.0 h`` (``-`` for None)."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.1f} h"


def instance_overlay(rec: InstanceRecord, history: Sequence[HistoryRow],
                     attempts: Sequence[AttemptRow] = ()) -> dict[str, Any]:
    """One instance's path; each visited state gets its attempts (steps + failed
    attempts), wall time in it (entering to leaving, or to now's last update for the
    current state) and tokens (steps + failed attempts), and ``N takeovers`` where
    another worker adopted it there (``recovery`` rows: not moves, not attempts)."""
    recoveries: dict[str, int] = defaultdict(int)
    for row in history:
        recoveries[row.source] += row.kind == RECOVERY
    journal = [h for h in history if h.kind == TOOL]  # an agent state's turns and calls
    history = [h for h in history if h.kind not in NOT_MOVES]  # takeovers, migrations
    tries, tokens, wall = _per_state(rec, history, attempts)
    for row in journal:
        tokens[row.source] += row.tokens
    figures = {}
    for state in dict.fromkeys([*tries, *wall]):
        figures[state] = [_figure(tries.get(state, 0), wall.get(state, 0.0), tokens.get(state, 0))]
        if recoveries.get(state):
            n = recoveries[state]
            figures[state].append(f"{n} takeover{'s' * (n != 1)}")
    for state, line in tool_calls(journal).items():
        figures.setdefault(state, []).append(line)
    for row in history:  # a fan-out's join: how its branches ended
        counts = details.join_counts(row.detail) if row.kind == "join" else None
        if counts:
            figures.setdefault(row.source, []).append(_branch_counts(counts))
    return {"instance_id": rec.id, "state": rec.state, "status": rec.status,
            "history": [{"seq": h.seq, "source": h.source, "dest": h.dest, "trigger": h.trigger}
                        for h in history],
            "figures": figures}


def tool_calls(rows: Sequence[HistoryRow]) -> dict[str, str]:
    """Per agent state, its tool calls in ``rows`` (kind ``tool``): ``add×2 echo×1 (1 error)``."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    errors: dict[str, int] = defaultdict(int)
    for row in rows:
        d = details.as_object(row.detail)  # (its tool shown through str(), whatever it is)
        if d.get("agent") == "call":
            counts[row.source][str(d.get("tool"))] += 1
            errors[row.source] += "error" in d
    out = {}
    for state, tools in counts.items():
        line = " ".join(f"{name}×{n}" for name, n in sorted(tools.items()))
        n = errors[state]
        out[state] = line + (f" ({n} error{'s' * (n != 1)})" if n else "")
    return out


def _per_state(rec: InstanceRecord, history: Sequence[HistoryRow], attempts: Sequence[AttemptRow]
               ) -> tuple[dict[str, int], dict[str, int], dict[str, float]]:
    """Attempts, tokens and wall seconds per state, from the moves and failed attempts."""
    tries: dict[str, int] = defaultdict(int)
    tokens: dict[str, int] = defaultdict(int)
    wall: dict[str, float] = defaultdict(float)
    entered = rec.created_at
    for row in history:
        tries[row.source] += 1
        tokens[row.source] += row.tokens
        wall[row.source] += max(0.0, row.at - entered)
        entered = row.at
    if not rec.final:
        wall[rec.state] += max(0.0, rec.updated_at - entered)
    for a in attempts:
        tries[a.state] += 1
        tokens[a.state] += a.tokens
    return tries, tokens, wall


def _figure(tries: int, wall: float, tokens: int) -> str:
    """``2 attempts · 1.5 s · 120 tok`` (attempts and tokens left out when 0)."""
    lines = [f"{tries} attempt{'s' * (tries != 1)}"] if tries else []
    lines.append(seconds(wall))
    if tokens:
        lines.append(f"{tokens} tok")
    return " · ".join(lines)


def _branch_counts(counts: Mapping[str, int]) -> str:
    """How a join's branches ended: ``3 succeeded · 1 failed · 0 skipped``."""
    return (f"{counts.get('succeeded', 0)} succeeded · {counts.get('failed', 0)} failed · "
            f"{counts.get('skipped', 0)} skipped" + (f" · {counts['running']} cancelled"
                                                     if counts.get("running") else ""))


def aggregate_overlay(stats: MachineStats) -> dict[str, Any]:
    """Many instances of one machine: per state the instances in it now, mean wall time
    and mean tokens per step; per edge how many times it was taken."""
    figures = {}
    for name, st in stats.states.items():
        lines = [f"now {st.now}"] if st.now else []
        if st.steps:
            lines.append(f"mean {seconds(st.wall_s.mean)}")
            if st.tokens.total:
                lines.append(f"{st.tokens.mean:.0f} tok/step")
        if lines:
            figures[name] = [" · ".join(lines)]
    for state, tools in _tools_by_state(stats).items():
        figures.setdefault(state, []).append(tools)
    starts = sum(st.entered for st in stats.states.values()) - sum(e.taken for e in stats.edges)
    return {"instance_id": "", "title": f"{stats.instances} instance(s)",
            "moves": [{"source": e.source, "dest": e.dest, "trigger": e.trigger,
                       "count": e.taken} for e in stats.edges],
            "starts": max(0, starts), "figures": figures}


def _tools_by_state(stats: MachineStats) -> dict[str, str]:
    """Per agent state, its tools' calls over the instances: ``grep×12 read_file×30``."""
    out: dict[str, list[str]] = defaultdict(list)
    for t in stats.tools.values():
        out[t.state].append(f"{t.tool}×{t.calls}" + (f" ({t.errors} err)" if t.errors else ""))
    return {state: " ".join(parts) for state, parts in out.items()}


__all__ = ["instance_overlay", "aggregate_overlay", "seconds", "tool_calls"]
