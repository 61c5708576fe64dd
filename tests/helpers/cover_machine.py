"""A small machine with guards, a fallback and a failure (tests of ``fsm coverage``).

``n`` picks the path: ``n > 10`` → large; ``0 <= n <= 10`` → small; ``n < 0`` → the
action raises, the fallback edge goes to rescue; ``n == 7`` → small's guard refuses:
no transition passes, the instance fails.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    n: int = 0
    size: str = ""


def measure(ctx: Ctx) -> dict[str, Any]:
    if ctx.n < 0:
        raise ConnectionError("negative: the service refused it")  # retryable: fallback
    return {"size": "large" if ctx.n > 10 else "small"}


def is_big(ctx: Ctx) -> bool:
    return ctx.n > 10


def is_lucky(ctx: Ctx) -> bool:
    return ctx.n == 7


machine = Machine(
    name="covered", context=Ctx, initial="measure", max_transitions=10,
    states=[
        State("measure", action=measure, fallback="rescue"),
        State("large", action=lambda ctx: None, inline=True),
        State("small", action=lambda ctx: None, inline=True),
        State("rescue", action=lambda ctx: {"size": "unknown"}, inline=True),
        State("done", final=True),
        State("failed", final=True, failure=True),
    ],
    transitions=[
        Transition("big", "measure", "large", conditions=is_big),
        Transition("small", "measure", "small", unless=is_big),
        Transition("next", "large", "done"),
        Transition("next", "small", "done", unless=is_lucky),
        Transition("next", "rescue", "done"),
    ],
)

#: ``fsm test`` cases: every edge, the fallback and the refusal.
CASES = [
    {"name": "large", "input": {"n": 12}, "path": ["measure", "large", "done"]},
    {"name": "small", "input": {"n": 3}, "path": ["measure", "small", "done"]},
    {"name": "rescued", "input": {"n": -1}, "final": "done",
     "path": ["measure", "rescue", "done"], "output": {"size": "unknown"}},
    {"name": "refused", "input": {"n": 7}, "final": "failed"},
]
