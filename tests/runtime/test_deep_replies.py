"""A model reply nested 5,000 deep (issue 36): a recorded failure with a reason, as any
malformed model output is, never a ``RecursionError``.  Scripted model; SQLite files."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import agent_machine
from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Step, Transition
from fsm_engine.llm import Scripted
from fsm_engine.store.records import TOOL

DEEP = "[" * 5000 + "]" * 5000


class Verdict(BaseModel):
    verdict: str


class Ctx(BaseModel):
    verdict: str = ""


async def judge(ctx: Ctx, step: Step) -> dict[str, Any]:
    parsed = await step.llm.structured([{"role": "user", "content": "judge"}], Verdict)
    return {"verdict": parsed.value.verdict}


judged = Machine(name="deep-judge", context=Ctx, initial="judge",
                 states=[State("judge", action=judge), State("done", final=True)],
                 transitions=[Transition("next", "judge", "done")])


def _run(tmp_path: Path, machine: Machine, reply: str, data: dict[str, Any]) -> Any:
    engine = Engine(str(tmp_path / "deep.db"), llm=Scripted.from_replies([{"text": reply}]))
    iid = engine.start(machine, data)
    return engine, asyncio.run(engine.run(iid))


def test_a_structured_reply_5000_deep_fails_the_state_with_its_reason(tmp_path: Path) -> None:
    replies = (DEEP, '{"verdict": ' + DEEP + "}", "```json\n" + DEEP + "\n```")
    for n, reply in enumerate(replies):
        (tmp_path / str(n)).mkdir()
        engine, rec = _run(tmp_path / str(n), judged, reply, {})
        assert (rec.status, rec.state, rec.reason) == ("failed", "judge", "invalid_output")
        [row] = [r for r in engine.store.history(rec.id) if r.kind == "fail"]
        assert row.detail["reasks"] == 1  # re-asked once, as any malformed output is
        for output in row.detail["structured"]:
            assert output["errors"] == ["model output nests deeper than 100 levels of "
                                        "containers"], output["errors"]
        engine.close()


def test_an_agent_reply_5000_deep_is_a_failed_turn_each_time(tmp_path: Path) -> None:
    engine, rec = _run(tmp_path, agent_machine.machine, '{"tool_calls": ' + DEEP + "}",
                       {"question": "q"})
    assert (rec.status, rec.state) == ("completed", "turns_exhausted")
    turns = [r for r in engine.store.history(rec.id) if r.kind == TOOL]
    assert len(turns) == 3  # max_turns=4: three journaled, the fourth the fallback
    for turn in turns:
        assert "nests deeper than 100 levels" in turn.detail["error"], turn.detail["error"]
    engine.close()


def test_a_tool_result_5000_deep_is_refused_as_not_json() -> None:
    from fsm_engine.runtime.kinds.agent_tools import as_json
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    value, why = as_json(deep, 100_000)
    assert value is None and why is not None and "not JSON" in why, why
