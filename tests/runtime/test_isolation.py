"""One instance's fault stays its own: a poisoned step in a group commit, a poisoned
instance in a resume, a store failure, an unexpected error, and a resume in the same
process while ``run()`` is inside a step (issue 10, items 3 and 9)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_engine import Engine, FsmError, Machine, SqliteStore, State, StepRejected, StoreError, Transition
from fsm_engine.runtime import values
from fsm_engine.runtime.commit import GroupCommitter
from fsm_engine.store import HistoryRow, InstanceRecord, StepCommit
from fsm_engine.testing.contract import moved, record

N = 50
POISON = 17


class Ctx(BaseModel):
    n: int = 0
    poison: bool = False
    payload: Any = None


async def work(ctx: Ctx, step) -> dict:
    await asyncio.sleep(0)  # every instance reaches the commit in the same loop turn
    if ctx.poison:
        step.notes["callback"] = lambda: None  # no JSON form
    return {"n": ctx.n + 1}


MACHINE = Machine(
    name="isolation", context=Ctx, initial="work",
    states=[State("work", action=work), State("done", final=True),
            State("failed", final=True, failure=True)],
    transitions=[Transition("ok", "work", "done")])


def inputs() -> list[dict]:
    return [{"n": i, "poison": i == POISON} for i in range(N)]


def assert_one_failed(results: Sequence[Any], store: Any, ids: list[str], reason: str) -> None:
    assert len(results) == N and all(isinstance(r, InstanceRecord) for r in results)
    by_id = {r.id: r for r in results}
    for i, iid in enumerate(ids):
        rec = store.get(iid)
        assert rec == by_id[iid] or rec.version == by_id[iid].version
        if i == POISON:
            assert (rec.status, rec.state, rec.reason) == ("failed", "failed", reason)
            assert rec.owner is None and "callback" in (rec.last_error or "")
        else:
            assert (rec.status, rec.context["n"]) == ("completed", i + 1), i


def test_a_batch_of_50_with_one_unserialisable_value_commits_49(db_path: str) -> None:
    eng = Engine(db_path, seed=1)
    ids = eng.start_many(MACHINE, inputs())
    results = asyncio.run(eng.run_many(ids))
    assert eng.committer.batches < 10  # the steps really were group-committed
    assert_one_failed(results, eng.store, ids, "invalid_update")
    row = eng.store.history(ids[POISON])[-1]
    assert "step.notes.callback" in row.error and row.detail == {}
    eng.close()


def test_the_store_refusing_one_step_fails_it_alone(db_path: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's own check is the safety net when a value slips past the driver's."""
    monkeypatch.setattr(values, "check_json", lambda data, path="": None)
    eng = Engine(db_path, seed=1)
    ids = eng.start_many(MACHINE, inputs())
    results = asyncio.run(eng.run_many(ids))
    assert_one_failed(results, eng.store, ids, "store_rejected")
    eng.close()


def test_resume_over_50_with_one_poisoned(db_path: str) -> None:
    first = Engine(db_path)
    ids = first.start_many(MACHINE, inputs())
    first.close()  # its worker is gone: every instance is resumable
    second = Engine(db_path, seed=1)
    second.register(MACHINE)
    results = asyncio.run(second.resume())
    assert [r.id for r in results] == ids
    assert_one_failed(results, second.store, ids, "invalid_update")
    second.close()


class Flaky:
    """A SqliteStore whose writes fail like a broken disk while ``broken`` is set."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.broken = False

    def commit(self, steps: Sequence[StepCommit]) -> list[bool]:
        if self.broken:
            raise StoreError("database fsm.db: disk I/O error")
        return self.store.commit(steps)

    def release(self, owner: str, ids: Sequence[str] | None = None, *, now: float) -> int:
        if self.broken:
            raise StoreError("database fsm.db: disk I/O error")
        return self.store.release(owner, ids, now=now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_store_failure_reaches_every_waiter_and_leaves_no_claim(db_path: str) -> None:
    flaky = Flaky(SqliteStore(db_path))
    eng = Engine(flaky, seed=1)  # type: ignore[arg-type]
    ids = eng.start_many(MACHINE, [{"n": i} for i in range(5)])
    flaky.broken = True
    results = asyncio.run(eng.run_many(ids))
    assert all(isinstance(r, StoreError) and r.instance_id == i for r, i in zip(results, ids, strict=False))
    assert all(flaky.store.get(i).owner == eng.worker.id for i in ids)  # nothing could be written
    flaky.broken = False
    eng.ownership.check([])  # the heartbeat retries the releases once the store works again
    assert all(flaky.store.get(i).owner is None for i in ids)
    other = Engine(db_path, seed=2)
    other.register(MACHINE)
    done = asyncio.run(other.resume())
    assert [r.status for r in done] == ["completed"] * 5
    other.close()
    eng.close()


def test_an_unexpected_error_is_that_instance_outcome(db_path: str) -> None:
    eng = Engine(db_path, seed=1)
    ids = eng.start_many(MACHINE, [{"n": i} for i in range(3)])

    def on_step(rec: InstanceRecord) -> None:
        if rec.id == ids[1]:
            raise KeyError("a bug in the caller's callback")
    results = asyncio.run(eng.run_many(ids, on_step))
    assert isinstance(results[1], FsmError) and isinstance(results[1].__cause__, KeyError)
    assert results[1].instance_id == ids[1]
    assert [results[0].status, results[2].status] == ["completed", "completed"]
    assert eng.store.get(ids[1]).owner is None  # released: a resume may finish it
    eng.close()


def test_committer_hands_a_rejected_step_its_own_error(tmp_path) -> None:
    store = SqliteStore(str(tmp_path / "c.db"))
    recs = [record(f"i{k:02d}") for k in range(N)]
    store.create(*recs)

    def step(rec: InstanceRecord, bad: bool) -> StepCommit:
        new = moved(rec, "next")
        row = HistoryRow(instance_id=rec.id, seq=new.seq, source=rec.state, dest="next",
                         trigger="go", at=new.updated_at,
                         detail={"x": float("nan") if bad else 1.0})
        return StepCommit(new, rec.version, [row], before=rec)

    async def main() -> list[Any]:
        committer = GroupCommitter(store)
        return await asyncio.gather(*[committer.submit(step(r, i == POISON))
                                      for i, r in enumerate(recs)], return_exceptions=True)
    out = asyncio.run(main())
    assert isinstance(out[POISON], StepRejected) and out[POISON].instance_id == recs[POISON].id
    assert [o for i, o in enumerate(out) if i != POISON] == [True] * (N - 1)
    assert store.get(recs[POISON].id).state == "start" and store.history(recs[POISON].id) == []
    assert all(store.get(r.id).state == "next" for i, r in enumerate(recs) if i != POISON)
    store.close()


# -- same-process resume (item 9) ----------------------------------------------------------------

CALLS: list[str] = []


async def slow(ctx: Ctx, step) -> dict:
    CALLS.append(step.instance_id)
    GATE_IN.set()
    await GATE_OUT.wait()
    return {"n": ctx.n + 1}


SLOW = Machine(
    name="slow", context=Ctx, initial="work",
    states=[State("work", action=slow), State("done", final=True)],
    transitions=[Transition("ok", "work", "done")])
GATE_IN = asyncio.Event()
GATE_OUT = asyncio.Event()


def test_resume_does_not_adopt_what_run_is_stepping(db_path: str) -> None:
    eng = Engine(db_path, seed=1)
    iid = eng.start(SLOW, {"n": 1})
    CALLS.clear()

    async def main() -> tuple[Any, Any, Any]:
        GATE_IN.clear()
        GATE_OUT.clear()
        running = asyncio.ensure_future(eng.run(iid))
        await GATE_IN.wait()  # run() is inside the action
        resumed = await eng.resume()
        again = asyncio.ensure_future(eng.run(iid))  # a second run() waits for the first
        await asyncio.sleep(0)
        GATE_OUT.set()
        return await running, resumed, await again

    rec, resumed, again = asyncio.run(main())
    assert resumed == [] and CALLS == [iid]
    assert rec.status == "completed" and rec.context["n"] == 2
    assert again.id == iid and again.status == "completed"
    assert [h.trigger for h in eng.store.history(iid)] == ["ok"]
    eng.close()


class Refusing:
    """A SqliteStore that refuses, like an encoding failure, any batch holding ``bad``."""

    def __init__(self, store: SqliteStore, bad: str) -> None:
        self.store, self.bad = store, bad

    def commit(self, steps: Sequence[StepCommit]) -> list[bool]:
        for i, step in enumerate(steps):
            if step.record.id == self.bad:
                raise StepRejected("refused", index=i, instance_id=self.bad)
        return self.store.commit(steps)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_an_instance_the_store_keeps_refusing_stops_alone(db_path: str) -> None:
    first = Engine(db_path)
    ids = first.start_many(MACHINE, [{"n": i} for i in range(5)])
    first.close()
    store = Refusing(SqliteStore(db_path), ids[2])
    second = Engine(store, seed=1)  # type: ignore[arg-type]
    second.register(MACHINE)
    results = asyncio.run(second.resume())
    assert isinstance(results[2], StepRejected) and results[2].instance_id == ids[2]
    assert [r.status for i, r in enumerate(results) if i != 2] == ["completed"] * 4
    second.close()
