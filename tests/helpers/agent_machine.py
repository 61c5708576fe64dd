"""Agent-state machines for the tests (issue 23): tools that log each run to a file.

``AGENT_TOOL_LOG``: each tool run appends ``{"tool", "pid", "args"}`` (a JSON line);
``AGENT_SINK``: ``send_report`` appends its idempotency key (the delivery);
``AGENT_KILL_IN``: a tool of that name SIGKILLs its own process mid-run, once
(``AGENT_KILL_IN_DONE``, a marker file, says it happened).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fsm_engine import Agent, Machine, RetryPolicy, RunInfo, State, ToolCall, Transition, tool


class Ctx(BaseModel):
    question: str
    answer: str = ""
    verdict: str = ""


class Answer(BaseModel):
    answer: str


def _log(name: str, args: dict[str, Any]) -> None:
    path = os.environ.get("AGENT_TOOL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"tool": name, "pid": os.getpid(), "args": args}) + "\n")
    victim, marker = os.environ.get("AGENT_KILL_IN"), os.environ.get("AGENT_KILL_IN_DONE")
    if victim == name and marker and not Path(marker).exists():
        Path(marker).write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)


def add(a: int, b: int) -> int:
    """Add two integers."""
    _log("add", {"a": a, "b": b})
    return a + b


async def echo(text: str) -> str:
    """Return the text unchanged."""
    _log("echo", {"text": text})
    return text


@tool(side_effect=True)
def send_report(text: str, call: ToolCall) -> str:
    """Send a report to the operator (an external effect)."""
    _log("send_report", {"text": text})
    sink = os.environ.get("AGENT_SINK")
    if sink:
        with open(sink, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": call.idempotency_key, "text": text}) + "\n")
    return "sent"


def boom() -> str:
    """Always fails."""
    raise RuntimeError("the disk is on fire")


def huge() -> str:
    """Returns far too much text."""
    return "x" * 100_000


def opaque() -> Any:
    """Returns something that is not JSON."""
    return object()


@tool(timeout=0.2)
async def stall() -> str:
    """Never answers in time (async)."""
    await asyncio.sleep(30)
    return "late"


@tool(timeout=0.2)
def stall_sync() -> str:
    """Never answers in time (a thread)."""
    time.sleep(1.0)
    return "late"


_flaky_runs: list[int] = []


@tool(retry=RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=0.0))
def flaky() -> str:
    """Fails twice, then works."""
    _flaky_runs.append(1)
    if len(_flaky_runs) % 3:
        raise ConnectionError("try again")
    return "ok"


def _machine(name: str, agent: Agent, **kw: Any) -> Machine:
    outcomes = ["turns_exhausted", "budget_exhausted"] + (["rejected"] if agent.approve else [])
    return Machine(
        name=name, context=Ctx, initial="research", **kw,
        states=[State("research", agent=agent), State("answered", final=True),
                *[State(o, final=True) for o in outcomes]],
        transitions=[Transition("done", "research", "answered"),
                     *[Transition(o, "research", o) for o in outcomes]])


TOOLS = [add, echo, send_report, boom, huge, opaque, flaky, stall, stall_sync]

#: Tools, no approval: the loop, durability and bounds.
machine = _machine("agent-loop", Agent(tools=TOOLS, output=Answer, max_turns=4,
                                       instructions="Answer the question."),
                   max_transitions=30, token_budget=None)

#: ``send_report`` needs approval (SLA from ``AGENT_SLA_S``; on timeout: reject).
SLA = float(os.environ.get("AGENT_SLA_S", "0") or 0) or None
approved = _machine("agent-approve", Agent(
    tools=TOOLS, output=Answer, max_turns=4, approve=["send_report"], sla_s=SLA,
    on_timeout="reject" if SLA else None), max_transitions=30)


def whole_visit(ctx: Ctx, run: RunInfo) -> bool:
    """True when an agent's final turn sees its visit's every token: the first turn's 400,
    the failed turn's 1000 and its own 400 (issue 36), as the instance's count does."""
    return (run.state_tokens_used, run.tokens_used) == (1800, 1800)


#: An agent state whose ``done`` guard reads the visit's tokens after a failed turn
#: (``whole_visit``; tests/runtime/kinds/test_replay_budget.py).
budget_guarded = Machine(
    name="agent-budget-guard", context=Ctx, initial="research", max_transitions=50,
    states=[State("research", retry=RetryPolicy(max_attempts=3, initial_interval=0.0,
                                                jitter=0.0),
                  agent=Agent(tools=TOOLS, output=Answer)),
            State("answered", final=True), State("cheap", final=True),
            State("out", final=True)],
    transitions=[Transition("done", "research", "answered", conditions=whole_visit),
                 Transition("done", "research", "cheap"),
                 Transition("turns_exhausted", "research", "out"),
                 Transition("budget_exhausted", "research", "out")])
