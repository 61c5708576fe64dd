"""Bulk actions by query (``runtime.bulk``) on both backends: batches, idempotent repeats,
an interruption between batches, forks and reruns made once however often repeated."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from conftest import ROOT

from fsm_engine import InvalidInput, load_machine
from fsm_engine.store import InstanceFilter

CONSOLE = str(ROOT / "tests/helpers/console_machine.py")


def _machine(ref: str = CONSOLE) -> Any:
    return load_machine(ref)[0]


def _kinds(eng: Any, ids: list[str]) -> Counter[str]:
    return Counter(h.kind for i in ids for h in eng.store.history(i))


def test_pause_unpause_cancel_by_query_in_batches_and_idempotent(engine_factory: Any) -> None:
    eng = engine_factory(llm=None)
    ids = eng.start_many(_machine(), [{"n": i} for i in range(25)], enqueue=True)
    where = InstanceFilter(machine="console")
    preview = eng.bulk_plan("pause", where, preview=True)
    assert (preview.count, preview.ids, len(preview.sample)) == (25, [], 10)
    batches: list[int] = []
    done = eng.bulk(eng.bulk_plan("pause", where), by="ops", batch=10,
                    on_batch=lambda d: batches.append(d.changed))
    assert (done.changed, done.batches, batches) == (25, 3, [10, 20, 25])
    again = eng.bulk(eng.bulk_plan("pause", where), by="ops", batch=10)
    assert (again.changed, again.skipped) == (0, 25)  # none twice
    eng.bulk(eng.bulk_plan("unpause", where), by="ops")
    assert {eng.store.get(i).status for i in ids} == {"pending"}
    eng.bulk(eng.bulk_plan("cancel", InstanceFilter(machine="console", statuses=("pending",))),
             by="ops")
    assert _kinds(eng, ids) == {"pause": 25, "unpause": 25, "cancel": 25}
    assert {h.detail["operator"] for i in ids for h in eng.store.history(i)} == {"ops"}
    with pytest.raises(InvalidInput, match="unknown bulk action"):
        eng.bulk_plan("explode", where)


def test_an_interrupted_bulk_leaves_whole_batches_and_a_repeat_finishes(
        engine_factory: Any) -> None:
    eng = engine_factory(llm=None)
    ids = eng.start_many(_machine(), [{"n": i} for i in range(30)], enqueue=True)
    where = InstanceFilter(machine="console", statuses=("pending",))

    def stop_after_two(done: Any) -> None:
        if done.batches == 2:
            raise KeyboardInterrupt  # the operator's Ctrl-C between two transactions
    with pytest.raises(KeyboardInterrupt):
        eng.bulk(eng.bulk_plan("cancel", where), batch=7, on_batch=stop_after_two)
    assert Counter(eng.store.get(i).status for i in ids) == {"cancelled": 14, "pending": 16}
    done = eng.bulk(eng.bulk_plan("cancel", where), batch=7)
    assert done.changed == 16
    assert _kinds(eng, ids) == {"cancel": 30}


def test_fork_and_rerun_by_query_make_each_fork_once(engine_factory: Any) -> None:
    eng = engine_factory(llm=None)
    inbox = _machine(CONSOLE + ":inbox")
    ids = [eng.start(inbox, {"note": str(i)}) for i in range(4)]

    async def settle() -> None:
        for iid in ids:
            await eng.run(iid)
            await eng.signal(iid, "release", {"count": 1})
    asyncio.run(settle())
    where = InstanceFilter(machine="inbox", statuses=("completed",))
    with pytest.raises(InvalidInput, match="state"):
        eng.bulk(eng.bulk_plan("rerun", where))
    first = eng.bulk(eng.bulk_plan("rerun", where), by="ops", state="hold", batch=3)
    second = eng.bulk(eng.bulk_plan("rerun", where), state="hold", batch=3)
    assert (first.changed, second.changed, second.skipped) == (4, 0, 4)
    forks = [r for r in eng.store.list() if r.forked_from in ids]
    assert sorted(r.forked_from for r in forks) == sorted(ids)  # one each
    assert {r.state for r in forks} == {"hold"}
    assert [r.fork_options for r in forks] == [{"by": "ops"}] * 4  # who made each
    none = eng.bulk(eng.bulk_plan("fork", where))  # from the last failure: there is none
    assert (none.changed, none.skipped) == (0, 4)


def test_resume_by_query_restarts_cancelled_and_failed_ones_where_they_stopped(
        engine_factory: Any) -> None:
    from pause_machine import FAULTY, retrying
    eng = engine_factory(llm=None)
    FAULTY["on"] = True  # a module global: each backend's run starts faulty

    async def go() -> None:
        cancelled = eng.start_many(_machine(CONSOLE + ":inbox"), [{"note": "c"}], enqueue=True)[0]
        await eng.run(cancelled)  # waiting in hold
        eng.cancel(cancelled, operator="ops")
        failed = eng.start(retrying(machine_policy=None, name="bulkfail"))
        assert (await eng.run(failed)).status == "failed"
        plan = eng.bulk_plan("resume", InstanceFilter(statuses=("cancelled", "failed")))
        assert plan.count == 2
        done = eng.bulk(plan, by="ops")
        again = eng.bulk(eng.bulk_plan("resume", InstanceFilter(statuses=("cancelled",
                                                                          "failed"))))
        assert (done.changed, again.changed) == (2, 0)  # the plan matches none any more
        back = eng.store.get(cancelled)
        assert (back.status, back.state) == ("waiting", "hold")
        row = eng.store.history(cancelled)[-1]
        assert row.kind == "rerun" and row.detail["operator"] == "ops"
        FAULTY["on"] = False
        rec = await eng.run(failed)
        assert rec.status == "completed"
    asyncio.run(go())


def test_prune_deletes_ended_instances_through_the_engine_and_counts_one_that_moved_on(
        engine_factory: Any) -> None:
    """Issue 37 item 2: ``Engine.prune`` deletes only ended instances still at the version
    it selected them at; one restarted between its read and its delete is skipped and
    counted, and stays whole; a filter naming a live status is refused."""
    eng = engine_factory(llm=None)
    ids = eng.start_many(_machine(), [{"n": i} for i in range(5)], enqueue=True)
    for iid in ids[:4]:
        eng.cancel(iid, operator="ops")
    query, moved = eng.store.query, []

    def restarting_one(*args: Any, **kw: Any) -> Any:  # another operator, just after the read
        found = query(*args, **kw)
        if found and not moved:
            moved.append(eng.restart(found[0].id, by="bob").id)
        return found
    eng.store.query = restarting_one
    done = eng.prune(InstanceFilter(machine="console"), batch=3)
    assert (done.matching, done.deleted, done.skipped) == (4, 3, 1)
    survivors = {r.id: r.status for r in eng.store.list()}
    assert survivors == {moved[0]: "running", ids[4]: "pending"}  # the restarted one, whole
    assert [h.kind for h in eng.store.history(moved[0])] == ["cancel", "rerun"]
    dry = eng.prune(InstanceFilter(machine="console"), dry_run=True)
    assert (dry.matching, dry.deleted, dry.skipped) == (0, 0, 0)
    with pytest.raises(InvalidInput, match="ended instances only"):
        eng.prune(InstanceFilter(statuses=("pending",)))
