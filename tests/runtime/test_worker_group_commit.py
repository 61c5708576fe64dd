"""A worker's claimed batch commits together (``Runner.solo``): steps that never await (a
timer edge's fire, issue 38) used to commit one transaction each, the first of the batch
finding itself alone while the others waited to start."""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Transition
from fsm_engine.runtime.worker import Worker


class C(BaseModel):
    n: int = 0


MACHINE = Machine(name="due", context=C, initial="a", states=[
    State("a"), State("w", wait=True), State("done", final=True)],
    transitions=[Transition("go", "a", "w"), Transition("t", "w", "done", after=0.05)])


def test_a_worker_fires_a_batch_of_due_timers_in_few_commits(tmp_path) -> None:
    engine = Engine(str(tmp_path / "fsm.db"))
    ids = engine.start_many(MACHINE, [{} for _ in range(40)])
    asyncio.run(engine.run_many(ids))
    due = max(engine.store.get(i).next_attempt_at or 0.0 for i in ids)
    while time.time() <= due:  # every timer falls due before the worker claims
        time.sleep(0.01)
    before = engine.committer.batches

    async def serve() -> None:
        worker = Worker(engine, concurrency=64, poll=0.05)
        task = asyncio.ensure_future(worker.serve())
        while not all(engine.store.get(i).final for i in ids):
            await asyncio.sleep(0.02)
        worker.stop()
        await task
    asyncio.run(serve())
    assert all(engine.store.get(i).state == "done" for i in ids)
    assert engine.committer.batches - before <= 10  # 40 before: one commit per fire
    engine.close()
