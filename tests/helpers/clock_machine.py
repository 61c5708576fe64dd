"""A machine whose every exit waits: retries (30 s backoff), a 10 s timeout, a 1 h review
SLA and an instance deadline (tests of ``fsm_engine.testing.VirtualClock``).

``build(scale, sla_s)`` gives the machine with every period but the SLA multiplied by
``scale`` (1: the real periods, run on the virtual clock; 0.002: small delays, run on the
real clock).
``mode`` in the input picks the path: ``ok`` (review), ``flaky`` (provider errors, then
the fallback), ``slow`` (timeouts, then the fallback), ``late`` (the deadline passes).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, State, Step, Transition
from fsm_engine.definition.review import Review


class Ctx(BaseModel):
    mode: str = "ok"
    answer: str = ""


def build(scale: float = 1.0, sla_s: float = 3600.0) -> Machine:
    async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
        if ctx.mode == "slow":
            await asyncio.sleep(20 * scale)  # past the 10 s timeout
        out = await step.llm.complete([{"role": "user", "content": ctx.mode}], max_tokens=8)
        return {"answer": out.text}

    def canned(ctx: Ctx) -> dict[str, Any]:
        return {"answer": "canned"}

    return Machine(
        name="clocked", context=Ctx, initial="ask", max_transitions=20,
        states=[
            State("ask", action=ask, timeout=10 * scale, fallback="canned",
                  retry=RetryPolicy(max_attempts=3, initial_interval=30 * scale,
                                    backoff_rate=1.0, max_interval=30 * scale, jitter=0.5)),
            State("canned", action=canned, inline=True),
            State("review", review=Review(prompt="Fine?", choices=["approve", "reject"],
                                          sla_s=sla_s, on_timeout="reject")),
            State("done", final=True),
            State("rejected", final=True),
            State("failed", final=True, failure=True),
        ],
        transitions=[
            Transition("answered", "ask", "review"),
            Transition("answered", "canned", "review"),
            Transition("approve", "review", "done"),
            Transition("reject", "review", "rejected"),
        ],
    )
