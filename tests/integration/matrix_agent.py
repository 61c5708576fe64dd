"""The agent-state rows of the intersection matrix (issue 23): the scripted model's replies,
an uninterrupted run's journal, and the invariants ``matrix_check`` adds for them.

The agents of ``tests/integration/matrix_machines.py`` make three turns: ``look`` (a plain tool), then
``report`` (a side effect, delivered to ``$MATRIX_SINK`` under its idempotency key; in
``agent_approve`` a person approves it first with ``fsm review decide``), then the final
answer. Each tool run appends ``{iid, state, visit, call, tool, pid, at}`` to
``$MATRIX_LOG`` before it returns. The replies are keyed by what each turn's prompt holds
(``fsm_engine.llm.scripted``), so any process resuming a loop gets the turn it is at.

``check(records, histories, executions, lost)``:

1. each turn and each tool call is journaled once per visit (one ``tool`` row per turn
   number, per call id, per ``ask`` and per ``decision``);
2. each journaled call ran before its row, at most once more per takeover (``recovery``
   row) or lost commit since the row before it, and after it only in a process taken
   over (a tool already past its lease check when that process stalled);
3. an agent ends as an uninterrupted run does: completed in ``answered``, its context
   holding that run's answer, its visit's journal of that run's shape (``SHAPES``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

#: The system prompt's task (turn 1 is keyed on it).
INSTRUCTIONS = "Matrix agent: look, then report."
ANSWER = "reported"

#: The scripted replies, most specific first (``Scripted`` takes the first group that fits).
SCRIPT: list[dict[str, Any]] = [
    {"match": '"result": "sent"', "text": json.dumps({"final": {"answer": ANSWER}})},
    {"match": '"result": "seen"',
     "tool_calls": [{"name": "report", "arguments": {"text": "all seen"}}]},
    {"match": INSTRUCTIONS, "tool_calls": [{"name": "look", "arguments": {"q": "x"}}]},
    {"text": "ok"},  # every other model call of the matrix
]

#: An uninterrupted visit's journal: (detail.agent, tool) per ``tool`` row, by machine.
SHAPES: dict[str, list[tuple[str, str | None]]] = {
    "agent_loop": [("turn", None), ("call", "look"), ("turn", None), ("call", "report")],
    "agent_stream": [("turn", None), ("call", "look"), ("turn", None), ("call", "report")],
    "agent_approve": [("turn", None), ("call", "look"), ("turn", None), ("ask", "report"),
                      ("decision", "report"), ("call", "report")],
}

_TOOL = "tool"


Runs = dict[tuple[str, int, str], list[dict[str, Any]]]


def check(records: Sequence[Any], histories: dict[str, list[Any]],
          executions: Sequence[dict[str, Any]], lost: int) -> list[str]:
    """Every violation of the three agent invariants (see the module docstring)."""
    runs: Runs = defaultdict(list)
    for e in executions:
        if "call" in e:
            runs[(e["iid"], e["visit"], e["call"])].append(e)
    problems: list[str] = []
    for rec in records:
        rows = histories[rec.id]
        if not any(r.kind == _TOOL for r in rows):
            continue
        problems += _journaled_once(rec.id, rows)
        # a fork's copied rows ran in its original (checked there)
        problems += _calls_ran(rec.id, rows[rec.forked_at_seq or 0:], runs, lost)
        problems += _as_uninterrupted(rec, rows)
    return problems


def _ident(detail: dict[str, Any]) -> tuple[Any, ...]:
    kind = detail.get("agent")
    return (detail.get("visit"), kind, detail.get("turn") if kind == "turn" else detail["call"])


def _journaled_once(iid: str, rows: list[Any]) -> list[str]:
    seen = Counter(_ident(r.detail) for r in rows if r.kind == _TOOL)
    return [f"{iid}: {kind} {what} of visit {visit} journaled {n} times"
            for (visit, kind, what), n in seen.items() if n > 1]


def _calls_ran(iid: str, rows: list[Any], runs: Runs, lost: int) -> list[str]:
    """Match each journaled call to its tool's runs, in time. A run after the call's row is
    excused only in a process its instance was taken from (a ``recovery`` row's
    ``from_pid``), within the takeover allowance: a tool that had passed its lease check
    when its process was stopped finishes when let go on (``Ownership.lease_current``); one
    that had not must not start (``tests/integration/test_agent_findings.py``, finding A1)."""
    problems: list[str] = []
    takeovers, stalled = 0, set()
    for row in rows:
        if row.kind == "recovery":
            takeovers += 1
            stalled.add(row.detail["recovery"].get("from_pid"))
        if row.kind != _TOOL:
            continue
        d = row.detail
        if d.get("agent") == "call" and not d.get("invalid") \
                and not d.get("delivered_by_original"):
            problems += _call_runs(iid, row, runs[(iid, d["visit"], d["call"])],
                                   1 + takeovers + lost, stalled)
        takeovers = 0
    return problems


def _call_runs(iid: str, row: Any, runs: list[dict[str, Any]], allowed: int,
               stalled: set[Any]) -> list[str]:
    what = f"{iid}: call {row.detail['call']} ({row.detail['tool']})"
    mine = [e for e in runs if e["at"] <= row.at]
    late = [e for e in runs if e["at"] > row.at]
    excused = [e for e in late if e["pid"] in stalled]
    problems = []
    if not mine:
        problems.append(f"{what} journaled without a run")
    elif len(mine) + len(excused) > allowed:
        problems.append(f"{what} ran {len(mine) + len(excused)} times, {allowed} allowed "
                        "(1 + takeovers since the row before + lost commits)")
    if len(late) > len(excused):
        problems.append(f"{what} ran {len(late) - len(excused)} time(s) after it was "
                        f"journaled (seq {row.seq}), not in a process taken over")
    return problems


def _as_uninterrupted(rec: Any, rows: list[Any]) -> list[str]:
    if rec.machine not in SHAPES:
        return []
    if (rec.status, rec.state) != ("completed", "answered"):
        return [f"{rec.id}: the agent ended {rec.status} in {rec.state} ({rec.reason}), an "
                "uninterrupted run completes in answered"]
    problems = []
    if rec.context.get("answer") != ANSWER:
        problems.append(f"{rec.id}: answer {rec.context.get('answer')!r}, an uninterrupted "
                        f"run's is {ANSWER!r}")
    shape = [(r.detail.get("agent"), r.detail.get("tool")) for r in rows if r.kind == _TOOL]
    if shape != SHAPES[rec.machine]:
        problems.append(f"{rec.id}: journal {shape}, an uninterrupted run's is "
                        f"{SHAPES[rec.machine]}")
    return problems
