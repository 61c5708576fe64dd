"""Machines with timer edges (issue 38), a module of its own: worker processes load it by path.

- ``nudge``: ``wait`` (``send reply``, or the timer ``nudge`` after ``TIMER_S`` seconds,
  env, default 60) -> ``done`` / ``expired``;
- ``reviewed``: a review (SLA 100 s, ``on_timeout=no``) beside a timer ``late`` of 50 s;
- ``fan``: a fan-out over ``words`` (a ``slow`` item sleeps until cancelled) beside a
  timer ``give_up`` of 30 s.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.definition.fanout import Map
from fsm_engine.definition.review import Review

TIMER_S = float(os.environ.get("TIMER_S", "60"))


class Ctx(BaseModel):
    text: str = ""
    at: float | None = None
    words: list[str] = []
    results: list[dict | None] = []


def due_at(ctx: Ctx) -> datetime | float:
    """A callable delay: an aware datetime when the context names one, else 5 s."""
    return datetime.fromtimestamp(ctx.at, UTC) if ctx.at is not None else 5.0


nudge = Machine(
    name="nudge", context=Ctx, initial="start",
    states=[State("start"), State("wait", wait=True), State("done", final=True),
            State("expired", final=True)],
    transitions=[Transition("go", "start", "wait"), Transition("reply", "wait", "done"),
                 Transition("nudge", "wait", "expired", after=TIMER_S)])

called = Machine(
    name="called", context=Ctx, initial="start",
    states=[State("start"), State("wait", wait=True), State("done", final=True),
            State("expired", final=True)],
    transitions=[Transition("go", "start", "wait"), Transition("reply", "wait", "done"),
                 Transition("nudge", "wait", "expired", after=due_at)])

reviewed = Machine(
    name="reviewed", context=Ctx, initial="start",
    states=[State("start"),
            State("ask", review=Review(prompt="ok?", choices=["yes", "no"], sla_s=100,
                                       on_timeout="no")),
            State("yes", final=True), State("no", final=True), State("late", final=True)],
    transitions=[Transition("go", "start", "ask"), Transition("yes", "ask", "yes"),
                 Transition("no", "ask", "no"), Transition("late", "ask", "late", after=50)])


class Word(BaseModel):
    word: str
    out: str = ""


async def shout(ctx: Word) -> dict:
    if ctx.word == "slow":
        await asyncio.sleep(3600)
    return {"out": ctx.word.upper()}


item = Machine(name="item", context=Word, initial="go", max_transitions=5,
               states=[State("go", action=shout), State("done", final=True),
                       State("failed", final=True, failure=True)],
               transitions=[Transition("ok", "go", "done")])

fan = Machine(
    name="fan", context=Ctx, initial="start",
    states=[State("start"),
            State("map", fan_out=Map(items="words", machine=item, item_field="word",
                                     into="results")),
            State("done", final=True), State("broken", final=True, failure=True),
            State("gave_up", final=True)],
    transitions=[Transition("go", "start", "map"), Transition("joined", "map", "done"),
                 Transition("branch_failed", "map", "broken"),
                 Transition("give_up", "map", "gave_up", after=30)])

#: What ``fsm worker --machines`` of this module loads.
machine = nudge
