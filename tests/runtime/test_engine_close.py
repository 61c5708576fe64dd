"""``Engine.close`` gives back what it holds between steps: the next engine claims those
instances without a takeover row; an instance cancelled mid-step stays held, and taking it
over is a recovery.  Each test runs on SQLite and on PostgreSQL (``store_url``)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Transition


class Ctx(BaseModel):
    n: int = 0


#: Set by a test before its first engine runs: the action's second step announces it has
#: started, then waits until its run is cancelled (mid-step).
GATE: dict[str, asyncio.Event] = {}


async def work(ctx: Ctx) -> dict:
    entered = GATE.pop("entered", None) if ctx.n == 1 else None
    if entered is not None:
        entered.set()
        await asyncio.Event().wait()  # mid-step until cancelled
    return {"n": ctx.n + 1}


MACHINE = Machine(
    name="closing", context=Ctx, initial="first",
    states=[State("first", action=work), State("second", action=work),
            State("done", final=True)],
    transitions=[Transition("on", "first", "second"), Transition("fin", "second", "done")])


def _kinds(engine: Engine, iid: str) -> list[tuple[str, str, str]]:
    return [(h.kind, h.source, h.dest) for h in engine.store.history(iid)]


def test_instances_started_and_never_run_are_given_back_on_close(store_url: str) -> None:
    first = Engine(store_url)
    ids = first.start_many(MACHINE, [{}, {"n": 5}, {"n": 9}])
    first.close()
    second = Engine(store_url)
    try:
        assert [second.store.get(i).owner for i in ids] == [None] * 3
        second.register(MACHINE)
        done = asyncio.run(second.run_many(ids))
        assert [(r.status, r.context["n"], r.recoveries) for r in done] == [
            ("completed", 2, 0), ("completed", 7, 0), ("completed", 11, 0)]
        for iid in ids:  # no recovery row: the history starts with the first state's step
            assert _kinds(second, iid) == [("transition", "first", "second"),
                                           ("transition", "second", "done")]
        assert second.store.check() == []
    finally:
        second.close()


async def _cut_mid_step(engine: Engine, iid: str) -> None:
    GATE["entered"] = entered = asyncio.Event()
    task = asyncio.ensure_future(engine.run(iid))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_an_instance_cancelled_mid_step_stays_held_and_its_takeover_is_a_recovery(
        store_url: str) -> None:
    first = Engine(store_url)
    cut, idle = first.start_many(MACHINE, [{}, {}])
    asyncio.run(_cut_mid_step(first, cut))
    gone = first.worker.id
    first.close()
    second = Engine(store_url)
    try:
        assert (second.store.get(cut).owner, second.store.get(idle).owner) == (gone, None)
        second.register(MACHINE)
        done = asyncio.run(second.run_many([cut, idle]))
        assert [r.status for r in done] == ["completed", "completed"]
        assert _kinds(second, idle)[0] == ("transition", "first", "second")
        rows = second.store.history(cut)  # its first step committed, its second was cut
        assert [h.kind for h in rows] == ["transition", "recovery", "transition"]
        info = rows[1].detail["recovery"]
        assert (info["from"], info["cause"], info["status"], info["mid_step"]) == (
            gone, "deregistered", "running", True)
        assert done[0].context["n"] == 2 and second.store.check() == []
    finally:
        second.close()
