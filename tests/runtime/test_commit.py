"""GroupCommitter: concurrent steps share transactions, each still all-or-nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_engine import SqliteStore, StoreError
from fsm_engine.runtime.commit import GroupCommitter
from fsm_engine.store import HistoryRow, InstanceRecord, StepCommit
from fsm_engine.testing.contract import moved, record


class Recording:
    """A SqliteStore wrapper recording each commit's batch size and thread; optionally
    failing every commit."""

    def __init__(self, store: SqliteStore, *, fail: bool = False) -> None:
        self.store = store
        self.sizes: list[int] = []
        self.threads: list[str] = []
        self.fail = fail

    def commit(self, steps: Sequence[StepCommit]) -> list[bool]:
        self.sizes.append(len(steps))
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise StoreError("disk I/O error")
        return self.store.commit(steps)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(str(tmp_path / "commit.db"))
    yield s
    s.close()


def _seed(store: SqliteStore, n: int) -> list[InstanceRecord]:
    recs = [record(f"i{k:03d}") for k in range(n)]
    store.create(*recs)
    return recs


def _step(rec: InstanceRecord, *, stale: bool = False) -> StepCommit:
    new = moved(rec, "next")
    row = HistoryRow(instance_id=rec.id, seq=new.seq, source=rec.state, dest="next",
                     trigger="go", at=new.updated_at)
    return StepCommit(new, rec.version + (7 if stale else 0), [row], before=rec)


def test_concurrent_steps_share_one_transaction_each_all_or_nothing(store: SqliteStore) -> None:
    recs = _seed(store, 40)
    wrapped = Recording(store)
    committer = GroupCommitter(wrapped)  # type: ignore[arg-type]

    async def main() -> list[bool]:
        return await asyncio.gather(*[committer.submit(_step(r, stale=(i == 13)))
                                      for i, r in enumerate(recs)])

    ok = asyncio.run(main())
    assert wrapped.sizes == [40]
    assert ok == [i != 13 for i in range(40)]
    assert store.get("i013").state == "start" and store.history("i013") == []
    assert store.get("i014").state == "next" and len(store.history("i014")) == 1


def test_max_batch_caps_a_transaction(store: SqliteStore) -> None:
    recs = _seed(store, 25)
    wrapped = Recording(store)
    committer = GroupCommitter(wrapped, max_batch=10)  # type: ignore[arg-type]

    async def main() -> list[bool]:
        return await asyncio.gather(*[committer.submit(_step(r)) for r in recs])

    assert all(asyncio.run(main()))
    assert wrapped.sizes == [10, 10, 5]
    assert committer.batches == 3 and committer.steps == 25


def test_a_store_error_reaches_every_step_of_the_batch(store: SqliteStore) -> None:
    recs = _seed(store, 5)
    wrapped = Recording(store, fail=True)
    committer = GroupCommitter(wrapped)  # type: ignore[arg-type]

    async def main() -> list[object]:
        return await asyncio.gather(*[committer.submit(_step(r)) for r in recs],
                                    return_exceptions=True)

    out = asyncio.run(main())
    assert all(isinstance(x, StoreError) for x in out)
    wrapped.fail = False

    async def again() -> bool:  # the committer still works after a failed batch
        return await committer.submit(_step(recs[0]))

    assert asyncio.run(again()) is True
    assert store.get(recs[0].id).state == "next"


def test_a_lone_instance_commits_inline(store: SqliteStore) -> None:
    rec = _seed(store, 1)[0]
    wrapped = Recording(store)
    committer = GroupCommitter(wrapped, solo=lambda: True)  # type: ignore[arg-type]
    assert asyncio.run(committer.submit(_step(rec))) is True
    assert wrapped.threads == [threading.main_thread().name]
    assert store.get(rec.id).state == "next"


def _quick_machine():
    from pydantic import BaseModel

    from fsm_engine import Machine, State, Transition

    class Ctx(BaseModel):
        n: int = 0

    async def bump(ctx: Ctx) -> dict:  # never suspends
        return {"n": ctx.n + 1}

    return Machine(name="quick", context=Ctx, initial="a",
                   states=[State("a", action=bump), State("b", action=bump),
                           State("c", action=bump), State("done", final=True)],
                   transitions=[Transition("go", "a", "b"), Transition("go", "b", "c"),
                                Transition("go", "c", "done")])


@pytest.mark.parametrize("how", ["run_many", "resume"])
def test_async_actions_that_never_suspend_are_group_committed(tmp_path: Path, how: str) -> None:
    from fsm_engine import Engine

    eng = Engine(str(tmp_path / "g.db"))
    ids = eng.start_many(_quick_machine(), [{}] * 200)
    if how == "resume":  # as after a crash: nobody holds them
        eng.ledger.release(eng.worker.id, ids)
    before = eng.committer.batches
    records = asyncio.run(eng.run_many(ids) if how == "run_many" else eng.resume())
    assert [r.state for r in records] == ["done"] * 200
    steps = 200 * 3
    batches = eng.committer.batches - before
    assert batches <= steps / 20, f"{batches} transactions for {steps} steps"
    eng.close()


def test_a_lone_run_still_commits_inline(tmp_path: Path) -> None:
    from fsm_engine import Engine

    eng = Engine(str(tmp_path / "g.db"))
    iid = eng.start(_quick_machine(), {})
    asyncio.run(eng.run(iid))
    assert eng.committer.batches == eng.committer.steps  # one transaction per step, no wait
    eng.close()


class Gated(Recording):
    """A Recording whose first commit waits until ``gate`` is set (a slow server)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.gate, self.entered = threading.Event(), threading.Event()

    def commit(self, steps: Sequence[StepCommit]) -> list[bool]:
        if not self.sizes:
            self.entered.set()
            assert self.gate.wait(30)
        return super().commit(steps)


def test_a_remote_store_commits_from_a_thread_one_batch_in_flight(pg_cluster) -> None:
    from fsm_engine.store import open_store
    pg = open_store(pg_cluster.database())
    recs = _seed(pg, 31)
    wrapped = Gated(pg)
    committer = GroupCommitter(wrapped)  # type: ignore[arg-type]
    assert committer.offload  # PostgresStore.remote

    async def main() -> list[bool]:
        first = asyncio.ensure_future(committer.submit(_step(recs[0])))
        await asyncio.to_thread(wrapped.entered.wait, 30)  # the loop runs on meanwhile
        rest = [asyncio.ensure_future(committer.submit(_step(r))) for r in recs[1:]]
        await asyncio.sleep(0)
        wrapped.gate.set()
        return await asyncio.gather(first, *rest)

    assert asyncio.run(main()) == [True] * 31
    assert wrapped.sizes == [1, 30]  # the 30 waiting behind the first went as one batch
    assert threading.main_thread().name not in wrapped.threads
    assert {r.state for r in pg.list()} == {"next"}
    pg.close()


def test_coalesced_calls_of_one_iteration_make_one_batch() -> None:
    from fsm_engine.runtime.commit import Coalesced
    batches: list[list[int]] = []

    def double(items: list[int]) -> list[int]:
        batches.append(items)
        if 13 in items:
            raise StoreError("database gone")
        return [2 * i for i in items]
    calls = Coalesced(double)

    async def main() -> tuple[list[int], list[object]]:
        ok = await asyncio.gather(*(calls(i) for i in range(5)))
        bad = await asyncio.gather(calls(12), calls(13), return_exceptions=True)
        return ok, bad

    ok, bad = asyncio.run(main())
    assert ok == [0, 2, 4, 6, 8] and batches == [[0, 1, 2, 3, 4], [12, 13]]
    assert all(isinstance(x, StoreError) for x in bad)  # every caller of the batch hears it


class Counting:
    """A store wrapper counting breaker reads and writes."""

    def __init__(self, store: SqliteStore) -> None:
        self.store, self.reads, self.writes = store, 0, 0

    def get_breaker(self, name: str) -> Any:
        self.reads += 1
        return self.store.get_breaker(name)

    def put_breaker(self, row: Any, expected: int) -> bool:
        self.writes += 1
        return self.store.put_breaker(row, expected)


def test_breaker_outcomes_of_one_iteration_share_one_write(store: SqliteStore) -> None:
    from fsm_engine import BreakerPolicy
    from fsm_engine.runtime.fleet.breaker import Breaker
    counting = Counting(store)
    br = Breaker(counting, "p:m", BreakerPolicy(failure_rate=0.5, min_calls=4))  # type: ignore[arg-type]

    async def main() -> None:
        await br.before_call()
        await br.before_call()  # a closed row read just now is trusted: no second read
        assert counting.reads == 1
        await asyncio.gather(*(br.record(ok) for ok in (True, False, True, False)))

    asyncio.run(main())
    assert (counting.reads, counting.writes) == (2, 1)
    row = store.get_breaker("p:m")
    assert row.state == "open"  # after the 4th outcome, in order: 2 of 4 failed
    assert [sum(e[1] for e in row.events), sum(e[2] for e in row.events)] == [2, 2]
