"""The streamed machine of the streaming tests (issue 22): one state whose action
streams its model reply; ``CHUNKS``, a scripted reply's pieces; ``run`` starts and runs
an instance, ``rows`` reads its stream log back as tuples."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Step, Transition

CHUNKS = ["Wri", "ting ", "as ", "it ", "goes."]


class Ctx(BaseModel):
    topic: str
    answer: str = ""
    seen: list[str] = []


async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
    reply = step.llm.stream([{"role": "user", "content": f"About {ctx.topic}"}], max_tokens=32)
    seen = [piece async for piece in reply]
    assert reply.completion is not None
    return {"answer": reply.completion.text, "seen": seen}


def machine(**state: Any) -> Machine:
    return Machine(name="streamed", context=Ctx, initial="ask", states=[
        State("ask", action=ask, **state), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])


def rows(engine: Engine, iid: str) -> list[tuple[Any, ...]]:
    return [(r.pos, r.seq, r.attempt, r.kind, r.text, r.offset) for r in
            engine.store.stream_read(iid)]


def run(engine: Engine, m: Machine, topic: str = "cats") -> tuple[str, Any]:
    iid = engine.start(m, {"topic": topic})
    return iid, asyncio.run(engine.run(iid))
