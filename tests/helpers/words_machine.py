"""A machine for exported tests of English words that merely contain pass/key/auth/token
(issue 36): the model's reply ``author=Bob; passage=...`` is parsed into context fields,
and a guard on ``author`` picks the edge, so a reply masked as ``author=***`` would take
the other one."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, State, Step, Transition


class Ctx(BaseModel):
    text: str
    author: str = ""
    passage: str = ""
    keyboard: str = ""
    reply: str = ""


async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
    out = await step.llm.complete([{"role": "user", "content": ctx.text}], max_tokens=32)
    fields = dict(re.findall(r"(\w+)=([^;]*)", out.text))
    return {"reply": out.text, "author": fields.get("author", ""),
            "passage": fields.get("passage", "")}


def by_bob(ctx: Ctx) -> bool:
    return ctx.author == "Bob"


machine = Machine(
    name="words", context=Ctx, initial="ask", max_transitions=5,
    states=[State("ask", action=ask), State("bob", final=True), State("someone", final=True)],
    transitions=[Transition("bob", "ask", "bob", conditions=by_bob),
                 Transition("other", "ask", "someone", unless=by_bob)],
)
