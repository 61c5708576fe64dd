"""A machine for ``fsm export-test``: a model call with retries, a guard and a review.

ask (the model; retried after 30 s) → review when the answer is longer than ``LONGER``
characters, else → done; review approve → done, reject (or its 1 h SLA) → dropped.
Tests copy this file with another ``LONGER`` to change the guard.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, State, Step, Transition
from fsm_engine.definition.review import Review

LONGER = 3


class Ctx(BaseModel):
    text: str
    answer: str = ""


async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
    out = await step.llm.complete([{"role": "user", "content": ctx.text}], max_tokens=16)
    return {"answer": out.text}


def wordy(ctx: Ctx) -> bool:
    return len(ctx.answer) > LONGER


machine = Machine(
    name="exported", context=Ctx, initial="ask", max_transitions=10,
    states=[
        State("ask", action=ask, retry=RetryPolicy(max_attempts=3, initial_interval=30.0)),
        State("review", review=Review(prompt="Keep it?", choices=["approve", "reject"],
                                      sla_s=3600.0, on_timeout="reject")),
        State("done", final=True),
        State("dropped", final=True),
    ],
    transitions=[
        Transition("long", "ask", "review", conditions=wordy),
        Transition("short", "ask", "done", unless=wordy),
        Transition("approve", "review", "done"),
        Transition("reject", "review", "dropped"),
    ],
)
