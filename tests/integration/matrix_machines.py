"""Machines for the intersection matrix (``tests/integration/test_matrix.py``); worker processes load
this file by path.

Every action appends one line to ``$MATRIX_LOG`` (JSON: instance, state, visit, attempt,
pid, and the time the engine started it: ``Step.started_at``, the clock read just before
its last lease check, so an action already under way when its process was stopped counts
where it began) *before* it returns, so the checker counts executions from outside; every
side effect (``notify``) also appends ``{key, item}`` to ``$MATRIX_SINK`` — a receiver
that keeps every delivery, repeats included, so the checker sees them all.
``MATRIX_VERSION=2`` gives version 2 of ``flow`` (a required ``lang`` its upcaster fills),
for the migration cells.

- ``flow``: work -> notify (side effect) -> done (plain action, rerun, fork, migration);
- ``fan``: start -> map (a ``Map`` of ``leaf`` over ``items``) -> finish -> done, ``leaf``
  being work -> notify -> done (fan-out child, join);
- ``reviewed``: work -> human-review (approve / reject) -> notify -> done (review decision);
- ``signal``: work -> wait (``Engine.send(id, "go")``) -> notify -> done (send);
- ``timed``: work -> wait (its timer edge ``late`` after ``$MATRIX_TIMER_S``, default 1 s)
  -> notify -> done (a timer's fire, issue 38; a fork of one waiting: ``fork-timer``);
- ``timed_first``: wait (the initial state; ``late`` after ``$MATRIX_TIMER_S``, armed by
  the first step) -> notify -> done (an initial state's timer, ``timer-initial``);
- ``fan_review``: ``fan`` whose children are ``reviewed`` (a review decision ending a child);
- ``budgeted``: ``flow`` whose guard reads the state's own token budget (replay);
- ``agent_loop``: research (an agent state: ``look``, then the side effect ``report``,
  then the answer; ``tests/integration/matrix_agent.py``) -> answered (agent steps);
- ``agent_approve``: ``agent_loop`` whose ``report`` waits for a person's approval;
- ``agent_stream``: ``agent_loop`` whose model turns stream several batches long (issue 36);
- ``stream_short``, ``stream_long``: ``flow`` whose ``work`` streams a model call
  (``step.llm.stream``; ``tests/integration/matrix_stream.py`` scripts the replies: one
  that ends within the batcher's ``FLUSH_S``, one several batches long).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from fsm_engine import Agent, Machine, State, Step, ToolCall, Transition, tool
from fsm_engine.definition import RunInfo
from fsm_engine.definition.fanout import Map
from fsm_engine.definition.review import Review

#: ``matrix_agent.INSTRUCTIONS`` (workers load this file without ``tests/`` on the path).
INSTRUCTIONS = "Matrix agent: look, then report."
VERSION = int(os.environ.get("MATRIX_VERSION", "1"))


def _append(env: str, line: dict[str, Any]) -> None:
    path = os.environ.get(env)
    if path:  # one write(2) on an O_APPEND file: a line is whole, also across processes
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


def ran(step: Step) -> None:
    """Record one execution of ``step``'s action."""
    _append("MATRIX_LOG", {"iid": step.instance_id, "state": step.state, "visit": step.visit,
                           "attempt": step.attempt, "pid": os.getpid(),
                           "at": step.started_at or time.time()})


class Ctx(BaseModel):
    item: str
    n: int = 0
    sent: list[str] = []


class Ctx2(Ctx):
    lang: str


def work(ctx: Ctx, step: Step) -> dict[str, Any]:
    ran(step)
    return {"n": ctx.n + 1}


def notify(ctx: Ctx, step: Step) -> dict[str, Any]:
    ran(step)
    _append("MATRIX_SINK", {"key": step.idempotency_key, "item": ctx.item})
    return {"sent": [*ctx.sent, step.idempotency_key]}


def _line(name: str, context: type, middle: Sequence[State], into: Sequence[Transition],
          action: Any = work, **kw: Any) -> Machine:
    return Machine(
        name=name, context=context, initial="work", max_transitions=20,
        states=[State("work", action=action), *middle,
                State("notify", action=notify, side_effect=True), State("done", final=True),
                *([State("rejected", final=True)] if middle else [])],
        transitions=[*into, Transition("sent", "notify", "done")], **kw)


def _add_lang(ctx: dict[str, Any]) -> dict[str, Any]:
    return {**ctx, "lang": ctx.get("lang", "en")}


flow = _line("flow", Ctx2 if VERSION == 2 else Ctx, [],
             [Transition("worked", "work", "notify")], version=VERSION,
             migrations={2: _add_lang} if VERSION == 2 else {})

reviewed = _line("reviewed", Ctx, [State("human-review", review=Review(
    prompt="Send it?", show=["item", "n"], choices=["approve", "reject"]))],
    [Transition("worked", "work", "human-review"),
     Transition("approve", "human-review", "notify"),
     Transition("reject", "human-review", "rejected")])

signal = _line("signal", Ctx, [State("wait", wait=True)],
               [Transition("worked", "work", "wait"), Transition("go", "wait", "notify"),
                Transition("no", "wait", "rejected")])

timed = _line("timed", Ctx, [State("wait", wait=True)],
              [Transition("worked", "work", "wait"),
               Transition("late", "wait", "notify",
                          after=float(os.environ.get("MATRIX_TIMER_S", "1"))),
               Transition("no", "wait", "rejected")])

#: ``timed`` whose initial state is the one that waits (a timer-initial cell): no row
#: enters it, its first step arms the timer in an in-place ``armed`` row.
timed_first = Machine(
    name="timed_first", context=Ctx, initial="wait", max_transitions=20,
    states=[State("wait", wait=True), State("notify", action=notify, side_effect=True),
            State("done", final=True), State("rejected", final=True)],
    transitions=[Transition("late", "wait", "notify",
                            after=float(os.environ.get("MATRIX_TIMER_S", "1"))),
                 Transition("no", "wait", "rejected"), Transition("sent", "notify", "done")])

leaf = _line("leaf", Ctx, [], [Transition("worked", "work", "notify")])


class Family(BaseModel):
    items: list[str] = []
    results: list[dict[str, Any] | None] = []
    n: int = 0


def begin(ctx: Family, step: Step) -> dict[str, Any]:
    ran(step)
    return {"n": ctx.n + 1}


def finish(ctx: Family, step: Step) -> dict[str, Any]:
    ran(step)
    return {"n": ctx.n + 1}


def _fan(name: str, branch: Machine) -> Machine:
    return Machine(
        name=name, context=Family, initial="start", max_transitions=20,
        states=[State("start", action=begin),
                State("map", fan_out=Map(items="items", machine=branch, item_field="item",
                                         into="results")),
                State("finish", action=finish), State("done", final=True),
                State("broken", final=True, failure=True)],
        transitions=[Transition("go", "start", "map"), Transition("joined", "map", "finish"),
                     Transition("branch_failed", "map", "broken"),
                     Transition("ok", "finish", "done")])


fan = _fan("fan", leaf)
reviewed_leaf = _line("reviewed_leaf", Ctx, reviewed.states[1:2], reviewed.transitions[:3])
fan_review = _fan("fan_review", reviewed_leaf)


def budget_left(ctx: Ctx, run: RunInfo) -> bool:
    """Go on while this visit's own budget (``State(token_budget=...)``) has tokens left."""
    return run.state_tokens_remaining is not None and run.state_tokens_remaining > 0


budgeted = Machine(
    name="budgeted", context=Ctx, initial="work", max_transitions=20,
    states=[State("work", action=work, token_budget=100),
            State("notify", action=notify, side_effect=True), State("done", final=True),
            State("over", final=True)],
    transitions=[Transition("worked", "work", "notify", conditions=budget_left),
                 Transition("worked", "work", "over"), Transition("sent", "notify", "done")])



def _ran_tool(call: ToolCall, name: str) -> None:
    _append("MATRIX_LOG", {"iid": call.instance_id, "state": call.state, "visit": call.visit,
                           "call": call.call, "tool": name, "pid": os.getpid(),
                           "at": time.time()})


def look(q: str, call: ToolCall) -> str:
    """Look something up."""
    _ran_tool(call, "look")
    return "seen"


@tool(side_effect=True)
def report(text: str, call: ToolCall) -> str:
    """Report to the operator (an external effect)."""
    _ran_tool(call, "report")
    _append("MATRIX_SINK", {"key": call.idempotency_key, "item": call.instance_id})
    return "sent"


class Asked(BaseModel):
    item: str
    answer: str = ""


class Answer(BaseModel):
    answer: str


def _agent(name: str, approve: Sequence[str] = ()) -> Machine:
    outcomes = ["turns_exhausted", "budget_exhausted", *(["rejected"] if approve else [])]
    return Machine(
        name=name, context=Asked, initial="research", max_transitions=20,
        states=[State("research", agent=Agent(tools=[look, report], output=Answer,
                                              max_turns=4, approve=approve,
                                              instructions=INSTRUCTIONS)),
                State("answered", final=True), *[State(o, final=True) for o in outcomes]],
        transitions=[Transition("done", "research", "answered"),
                     *[Transition(o, "research", o) for o in outcomes]])


agent_loop = _agent("agent_loop")
agent_approve = _agent("agent_approve", approve=["report"])
#: ``agent_loop`` whose turns stream several batches long (``matrix_stream.AGENT``).
agent_stream = _agent("agent_stream")

#: ``matrix_stream.PROMPTS`` (the scripted reply each streamed call is keyed on).
STREAM_PROMPTS = {"stream_short": "Matrix stream: short", "stream_long": "Matrix stream: long"}


class Said(Ctx):
    said: str = ""


def _speaker(prompt: str) -> Any:
    async def speak(ctx: Said, step: Step) -> dict[str, Any]:
        """Stream the scripted reply to the end; log the run before returning."""
        reply = step.llm.stream([{"role": "user", "content": f"{prompt} ({ctx.item})"}],
                                max_tokens=64)
        said = "".join([piece async for piece in reply])
        ran(step)
        return {"n": ctx.n + 1, "said": said}
    return speak


stream_short, stream_long = (
    _line(name, Said, [], [Transition("worked", "work", "notify")], action=_speaker(prompt))
    for name, prompt in STREAM_PROMPTS.items())

machine = flow
