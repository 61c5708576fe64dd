"""ask1 -> ask2 -> notify (a side effect, to the webhook ``FORK_SINK_URL``) -> done.

Both asks call the model; ``ASK2_SUFFIX`` changes ask2's prompt (a prompt edited
after the original ran), ask1's stays byte-identical.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, State, Step, Transition
from fsm_engine.sinks import post_webhook


class Ctx(BaseModel):
    text: str
    a1: str = ""
    a2: str = ""


async def ask1(ctx: Ctx, step: Step) -> dict[str, Any]:
    out = await step.llm.complete([{"role": "user", "content": f"Q1 {ctx.text}"}])
    return {"a1": out.text}


async def ask2(ctx: Ctx, step: Step) -> dict[str, Any]:
    suffix = os.environ.get("ASK2_SUFFIX", "")
    out = await step.llm.complete([{"role": "user", "content": f"Q2 {ctx.text}{suffix}"}])
    return {"a2": out.text}


def notify(ctx: Ctx, step: Step) -> dict[str, Any]:
    post_webhook(os.environ["FORK_SINK_URL"], {"a1": ctx.a1, "a2": ctx.a2}, step.idempotency_key)
    return {}


machine = Machine(
    "asked", context=Ctx, initial="ask1",
    states=[State("ask1", action=ask1), State("ask2", action=ask2),
            State("notify", action=notify, side_effect=True), State("done", final=True)],
    transitions=[Transition("next", "ask1", "ask2"), Transition("next", "ask2", "notify"),
                 Transition("next", "notify", "done")])
