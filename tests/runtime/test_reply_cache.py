"""The reply cache: the same prompt within the TTL is answered from the store with 0 tokens
and marked ``cached``; after the TTL the model is called again; never on side effects."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_engine import CachePolicy, DefinitionError, Engine, Machine, State, Step, Transition
from fsm_engine.llm.scripted import Scripted


class Ctx(BaseModel):
    topic: str
    answer: str = ""


async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
    out = await step.llm.complete([{"role": "user", "content": f"About {ctx.topic}"}],
                                  max_tokens=32)
    return {"answer": out.text}


machine = Machine(name="cached", context=Ctx, initial="ask", states=[
    State("ask", action=ask, cache=CachePolicy(ttl_s=60)), State("done", final=True)],
    transitions=[Transition("ok", "ask", "done")])


def test_same_prompt_is_answered_from_the_cache_until_the_ttl(engine_factory, tmp_path) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps({"text": f"reply {i}", "prompt_tokens": 7,
                                          "completion_tokens": 5}) + "\n" for i in range(3)))
    now = [1000.0]
    engine = engine_factory(llm=Scripted(script), clock=lambda: now[0])

    def run(topic: str) -> Any:
        iid = engine.start(machine, {"topic": topic})
        return asyncio.run(engine.run(iid)), engine.store.history(iid)[0]
    first, row1 = run("cats")
    second, row2 = run("cats")
    other, row3 = run("dogs")
    assert (first.tokens_used, first.context["answer"]) == (12, "reply 0")
    assert (second.tokens_used, second.context["answer"]) == (0, "reply 0")
    assert row2.detail["llm_calls"][0]["cached"] is True and row2.tokens == 0
    assert "cached" not in row1.detail["llm_calls"][0]
    assert (other.tokens_used, other.context["answer"]) == (12, "reply 1")  # another prompt
    now[0] += 61  # past the TTL: the model is called again
    late, row4 = run("cats")
    assert (late.tokens_used, late.context["answer"]) == (12, "reply 2")
    assert "cached" not in row4.detail["llm_calls"][0]


def test_no_cache_on_side_effect_states() -> None:
    bad = Machine(name="bad", context=Ctx, initial="ask", states=[
        State("ask", action=ask, side_effect=True, cache=CachePolicy(ttl_s=60)),
        State("done", final=True)], transitions=[Transition("ok", "ask", "done")])
    with pytest.raises(DefinitionError, match="side-effect state cannot use a reply cache"):
        Engine(":memory:").register(bad)
