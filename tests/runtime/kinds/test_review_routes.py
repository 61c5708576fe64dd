"""An open circuit breaker routes to the machine's review state instead of failing."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pydantic import BaseModel

from fsm_engine import Engine, Machine, Review, State, Step, Transition
from fsm_engine.llm.scripted import Scripted
from fsm_engine.runtime.model_registry import model_key
from fsm_engine.store import BreakerRow


class Ctx(BaseModel):
    answer: str = ""


async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
    return {"answer": (await step.llm.complete([{"role": "user", "content": "hi"}])).text}


machine = Machine(name="guarded", context=Ctx, initial="ask", on_circuit_open="desk", states=[
    State("ask", action=ask),
    State("desk", review=Review(prompt="The model is down: answer by hand?", show=["answer"],
                                choices=["answered"])),
    State("done", final=True)],
    transitions=[Transition("ok", "ask", "done"), Transition("answered", "desk", "done")])


def test_open_breaker_routes_to_review(tmp_path) -> None:
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"text": "never"}) + "\n")
    provider = Scripted(script)
    engine = Engine(str(tmp_path / "fsm.db"), llm=provider)
    now = time.time()
    engine.store.put_breaker(BreakerRow(model_key(provider), "open", [], now, now + 3600), 0)
    iid = engine.start(machine, {})
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.status, rec.reason) == ("desk", "waiting", "circuit_open")
    [item] = engine.reviews()
    done = engine.decide(item, "answered", by="ann")
    assert (done.state, done.status, done.reason) == ("done", "completed", None)
    engine.close()
