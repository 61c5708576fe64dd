"""The queued machine of the queue and fleet-limit tests: ``fetch`` on queue ``io``,
then ``ask`` (one model call) on queue ``llm``; ``replies(n)``: a scripted model
answering ``ok`` ``n`` times (5 + 10 tokens each)."""

from __future__ import annotations

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.llm.scripted import Scripted


class Ctx(BaseModel):
    n: int = 0
    answer: str = ""


def fetch(ctx: Ctx) -> dict:
    return {"n": ctx.n + 1}


async def ask(ctx: Ctx, step) -> dict:
    out = await step.llm.complete([{"role": "user", "content": "hi"}], max_tokens=20)
    return {"answer": out.text}


MACHINE = Machine(
    name="queued", context=Ctx, initial="fetch",
    states=[State("fetch", action=fetch, queue="io"), State("ask", action=ask, queue="llm"),
            State("done", final=True)],
    transitions=[Transition("next", "fetch", "ask"), Transition("next", "ask", "done")])


def replies(n: int = 1) -> Scripted:
    return Scripted.from_replies([{"text": "ok", "prompt_tokens": 5, "completion_tokens": 10}] * n)
