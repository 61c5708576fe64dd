"""A streamed call whose reader left early (issue 36 item 7): an action that ``break``s out
of ``async for`` (or leaves a call running) still leaves its attempt in the stream log,
ended at the step's commit, on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

from streamed_machine import Ctx

from fsm_engine import Engine, Machine, State, Step, Transition
from fsm_engine.llm.scripted import Scripted


async def first_piece(ctx: Ctx, step: Step) -> dict[str, Any]:
    reply = step.llm.stream([{"role": "user", "content": ctx.topic}], max_tokens=32)
    async for piece in reply:
        return {"answer": piece}  # (leaves the loop at its first piece)
    return {}


def machine() -> Machine:
    return Machine(name="early", context=Ctx, initial="ask", states=[
        State("ask", action=first_piece), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])


def facts(engine: Engine, iid: str) -> list[tuple[Any, ...]]:
    async def go() -> list[Any]:
        return [ev async for ev in engine.stream(iid)]
    return [(e.kind, e.seq, e.attempt, e.text, e.info.get("error")) for e in asyncio.run(go())]


def test_a_stream_left_after_its_pieces_came_together_is_ended_at_the_commit(
        engine_factory) -> None:
    """All pieces in one list, the call billed and recorded before the step commits: the
    attempt is in the log, ended with the step (``cancelled``: its reader left), its text
    the reply its history holds (it left no row at all: the generator's close comes on a
    later turn of the event loop, after the commit)."""
    engine = engine_factory(llm=Scripted.from_replies([{"chunks": ["a", "b", "c"],
                                                        "completion_tokens": 3}]), seed=1)
    iid = engine.start(machine(), {"topic": "t"})
    done = asyncio.run(engine.run(iid))
    assert (done.status, done.context["answer"]) == ("completed", "a")
    [call] = engine.store.history(iid)[0].detail["llm_calls"]
    assert call["reply"] == "abc"
    assert facts(engine, iid) == [("open", 1, 1, "", None), ("chunk", 1, 1, "abc", None),
                                  ("error", 1, 1, "", "cancelled"), ("step", 1, 0, "", None),
                                  ("final", 1, 0, "", None)]


def test_a_stream_left_while_its_call_runs_ends_as_cancelled_with_what_came(
        engine_factory) -> None:
    """Left at the first piece while the model still writes: the attempt ends with the
    step (an ``error`` row), holding what came before, and nothing comes after it."""
    engine = engine_factory(llm=Scripted.from_replies([{"chunks": ["a", "b", "c"],
                                                        "chunk_delay_s": 0.05}]), seed=1)
    iid = engine.start(machine(), {"topic": "t"})
    done = asyncio.run(engine.run(iid))
    assert (done.status, done.context["answer"]) == ("completed", "a")
    got = facts(engine, iid)
    assert got[0] == ("open", 1, 1, "", None) and got[-3:] == [
        ("error", 1, 1, "", "cancelled"), ("step", 1, 0, "", None), ("final", 1, 0, "", None)]
    assert "".join(f[3] for f in got if f[0] == "chunk") == "a"
