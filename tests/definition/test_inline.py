"""``State(..., inline=True)``: a quick plain ``def`` action runs on the event loop (no
thread hand-off); ``complete_sync`` there fails the step with one clear error instead of
deadlocking the loop; an inline action takes no timeout (issue 9, item 3)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_engine import DefinitionError, Engine, Machine, State, Transition
from fsm_engine.definition import check


class Ctx(BaseModel):
    thread: str = ""
    n: int = 0


def where(ctx: Ctx) -> dict[str, Any]:
    return {"thread": threading.current_thread().name, "n": ctx.n + 1}


def asks_sync(ctx: Ctx, step: Any) -> dict[str, Any]:
    step.llm.complete_sync([{"role": "user", "content": "hi"}])
    return {}


def machine(name: str, fn: Any, inline: bool) -> Machine:
    return Machine(name=name, context=Ctx, initial="a",
                   states=[State("a", action=fn, inline=inline), State("done", final=True)],
                   transitions=[Transition("go", "a", "done")])


def run_many(path: Path, m: Machine, n: int) -> list[Any]:
    async def main() -> list[Any]:
        engine = Engine(str(path))
        engine.register(m)
        try:
            return await engine.run_many(engine.start_many(m, [None] * n))
        finally:
            await engine.aclose()
    return asyncio.run(main())


@pytest.mark.parametrize("inline", [True, False])
def test_an_inline_action_runs_on_the_loop_thread(tmp_path: Path, inline: bool) -> None:
    records = run_many(tmp_path / "fsm.db", machine(f"where_{inline}", where, inline), 20)
    assert {r.status for r in records} == {"completed"}
    threads = {r.context["thread"] for r in records}
    if inline:
        assert threads == {threading.main_thread().name}
    else:
        assert threading.main_thread().name not in threads


def test_complete_sync_in_an_inline_action_fails_the_step_clearly(tmp_path: Path) -> None:
    [rec] = run_many(tmp_path / "fsm.db", machine("asks", asks_sync, True), 1)
    assert rec.status == "failed"
    assert "complete_sync cannot run in an inline action" in (rec.last_error or "")


def test_an_inline_action_takes_no_timeout() -> None:
    m = Machine(name="t", context=Ctx, initial="a",
                states=[State("a", action=where, inline=True, timeout=1.0),
                        State("done", final=True)],
                transitions=[Transition("go", "a", "done")])
    with pytest.raises(DefinitionError, match="inline action cannot be cut short"):
        check(m)
