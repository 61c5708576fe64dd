"""Pause and unpause (issue 25): status ``paused`` entered between steps, timers stopped
and resumed with the time left, ``on_retries_exhausted="pause"``; on both backends."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import lease_machine as lm
import pytest
from background_worker import Background, until
from pause_machine import CALLS, FAULTY, Ctx, retrying
from pydantic import BaseModel

from fsm_engine import (
    Engine,
    InstanceFinished,
    InvalidInput,
    Machine,
    Map,
    State,
    Transition,
)
from fsm_engine.store.records import InstanceFilter

GATE: dict[str, Any] = {}


async def slow(ctx: Ctx) -> dict[str, Any]:
    CALLS.append("slow")
    GATE["started"].set()
    await GATE["release"].wait()
    return {"n": ctx.n + 1}


async def after(ctx: Ctx) -> dict[str, Any]:
    CALLS.append("after")
    return {"n": ctx.n + 10}


def machine(**kw: Any) -> Machine:
    return Machine(
        name="pausing", initial="a", context=Ctx, **kw,
        states=[State("a", action=slow), State("b", action=after), State("done", final=True)],
        transitions=[Transition("next", "a", "b"), Transition("next", "b", "done")])


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    FAULTY["on"] = True


def _rows(eng: Engine, iid: str) -> list[tuple[str, str, str]]:
    return [(h.kind, h.source, h.dest) for h in eng.store.history(iid)]


def test_a_pause_mid_step_lands_the_step_and_starts_no_next_one(engine_factory: Any) -> None:
    eng = engine_factory()

    async def go() -> None:
        GATE.update(started=asyncio.Event(), release=asyncio.Event())
        iid = eng.start(machine())
        task = asyncio.ensure_future(eng.run(iid))
        await GATE["started"].wait()
        asked = eng.pause(iid, by="ann", reason="upstream outage")
        assert asked.status != "paused"  # a request: the running step finishes first
        GATE["release"].set()
        rec = await task
        assert rec.status == "paused" and rec.state == "b" and rec.context["n"] == 1
        assert CALLS == ["slow"]  # b's action never started
        assert _rows(eng, iid) == [("transition", "a", "b"), ("pause", "b", "b")]
        pause = eng.store.history(iid)[-1]
        assert pause.detail["operator"] == "ann" and pause.reason == "upstream outage"
        stored = eng.store.get(iid)
        assert stored.status == "paused" and stored.owner is None
        with pytest.raises(InvalidInput, match="paused"):
            await eng.run(iid)
        assert eng.store.get_meta(f"pause:{iid}") is None  # the request was used up
        eng.unpause(iid, by="bob")
        rec = await eng.run(iid)
        assert rec.status == "completed" and rec.context["n"] == 11
        kinds = [k for k, _, _ in _rows(eng, iid)]
        assert kinds == ["transition", "pause", "unpause", "transition"]
        assert eng.store.history(iid)[2].detail["operator"] == "bob"
        from fsm_engine.runtime import invariants
        assert eng.store.check() == [] and invariants.check(eng.store) == []  # fsm check
    asyncio.run(go())


def test_pausing_an_idle_instance_is_at_once_and_idempotent(engine_factory: Any) -> None:
    eng = engine_factory()
    iid = eng.start_many(machine(), [{}], enqueue=True)[0]
    first = eng.pause(iid, by="ann")
    again = eng.pause(iid, by="ann")
    assert first.status == again.status == "paused"
    assert [k for k, _, _ in _rows(eng, iid)] == ["pause"]  # once
    assert [r.id for r in eng.store.query(InstanceFilter(statuses=("paused",)))] == [iid]
    assert eng.resumable() == []
    other = eng.start_many(machine(), [{}], enqueue=True)[0]
    with pytest.raises(InvalidInput, match="not paused"):
        eng.unpause(other, by="x")
    assert [r.id for r in eng.resumable()] == [other]
    rec = eng.unpause(iid, by="ann")
    assert rec.status == "pending" and rec.owner is None
    assert sorted(r.id for r in eng.resumable()) == sorted([iid, other])


def test_a_final_instance_cannot_be_paused(engine_factory: Any) -> None:
    eng = engine_factory()
    iid = eng.start_many(machine(), [{}], enqueue=True)[0]
    eng.cancel(iid, operator="ann")
    assert eng.store.history(iid)[-1].detail == {"operator": "ann"}
    with pytest.raises(InstanceFinished):
        eng.pause(iid, by="ann")


def test_timers_stop_while_paused_and_resume_with_the_time_left(engine_factory: Any) -> None:
    now = [1000.0]
    eng = engine_factory(clock=lambda: now[0])
    iid = eng.start_many(machine(), [{}], enqueue=True, deadline_s=500.0)[0]
    rec = eng.store.get(iid)
    backoff = eng.client.ledger.apply_one(_with_timer(rec, 1030.0))
    assert backoff
    now[0] = 1010.0
    eng.pause(iid, by="ann")
    paused = eng.store.get(iid)
    assert paused.next_attempt_at is None
    detail = eng.store.history(iid)[-1].detail
    assert detail["timer_left_s"] == pytest.approx(20.0)
    assert detail["deadline_left_s"] == pytest.approx(490.0)
    now[0] = 5000.0  # long after both would have fired
    rec = eng.unpause(iid, by="ann")
    assert rec.next_attempt_at == pytest.approx(5020.0)
    assert rec.deadline == pytest.approx(5490.0)
    assert eng.store.history(iid)[-1].detail["paused_s"] == pytest.approx(3990.0)


def _with_timer(rec: Any, at: float) -> Any:
    from fsm_engine.runtime import outcome
    from fsm_engine.store.records import StepCommit
    new = outcome.clone(rec)
    new.next_attempt_at = at
    return StepCommit(new, rec.version, before=rec)


def test_retries_exhausted_pause_then_unpause_after_the_fix_completes(
        engine_factory: Any) -> None:
    eng = engine_factory()

    async def go() -> None:
        iid = eng.start(retrying())
        rec = await eng.run(iid)
        assert rec.status == "paused" and rec.reason == "retries_exhausted"
        assert "upstream 503" in (rec.last_error or "")
        pause = eng.store.history(iid)[-1]
        assert pause.kind == "pause" and pause.detail["operator"] is None
        assert CALLS == ["flaky"] * 3
        FAULTY["on"] = False  # the operator fixes the cause
        eng.unpause(iid, by="ops")
        rec = await eng.run(iid)
        assert rec.status == "completed"
        assert CALLS == ["flaky"] * 4
        assert [a.attempt for a in eng.store.attempts(iid)] == [1, 2]  # the retried ones
        assert [h.kind for h in eng.store.history(iid)] == ["pause", "unpause", "transition"]
        from fsm_engine.runtime import invariants
        assert eng.store.check() == [] and invariants.check(eng.store) == []  # fsm check
    asyncio.run(go())


def test_state_on_exhausted_overrides_the_machine(engine_factory: Any) -> None:
    eng = engine_factory()

    async def go() -> None:
        failed = await eng.run(eng.start(retrying(state_policy="fail", name="r1")))
        assert failed.status == "failed"
        paused = await eng.run(eng.start(retrying(state_policy="pause", machine_policy=None,
                                                         name="r2")))
        assert paused.status == "paused"
    asyncio.run(go())


def test_a_bad_pause_policy_is_a_definition_error() -> None:
    from fsm_engine import DefinitionError
    from fsm_engine.definition.check import check
    with pytest.raises(DefinitionError, match="on_retries_exhausted"):
        check(retrying(machine_policy="sleep"))


def test_a_request_left_by_a_holder_that_gave_the_instance_back_applies_at_the_next_claim(
        engine_factory: Any) -> None:
    holder, operator_ = engine_factory(), engine_factory()

    async def go() -> None:
        iid = holder.start(machine())  # held by ``holder``, a live worker, not yet stepped
        operator_.register(machine())
        asked = operator_.pause(iid, by="ann", reason="hold on")
        assert asked.status == "pending" and asked.reason is None
        assert asked.pause_request is not None  # the request, written with its touch
        assert operator_.pause(iid, by="ann").version == asked.version  # asked once
        holder.ownership.release([iid])  # given back before any step
        ran = await operator_.run(iid)  # the claim pauses it before any step
        assert ran.status == "paused"
        rec = operator_.store.get(iid)
        assert (rec.status, rec.reason, rec.owner) == ("paused", "hold on", None)
        assert CALLS == []
        [row] = operator_.store.history(iid)
        assert row.kind == "pause" and row.detail["operator"] == "ann"
        assert row.detail["reason"] is None and row.detail["status"] == "running"  # claimed
        assert operator_.store.get_meta(f"pause:{iid}") is None
    asyncio.run(go())


def test_unpausing_a_request_not_yet_applied_withdraws_it(engine_factory: Any) -> None:
    holder, operator_ = engine_factory(), engine_factory()

    async def go() -> None:
        GATE.update(started=asyncio.Event(), release=asyncio.Event())
        GATE["release"].set()
        iid = holder.start(machine())
        operator_.pause(iid, by="ann")
        operator_.unpause(iid, by="ann")  # before it applied: withdrawn
        rec = await holder.run(iid)  # the holder's steps still commit
        assert rec.status == "completed" and rec.reason is None
        assert [h.kind for h in holder.store.history(iid)] == ["transition", "transition"]
        assert holder.store.get(iid).reason is None
        assert operator_.store.get_meta(f"pause:{iid}") is None
    asyncio.run(go())


def test_two_operators_asking_at_once_make_one_request_not_a_pause_mid_step(
        engine_factory: Any) -> None:
    holder, ann, bob = engine_factory(), engine_factory(), engine_factory()
    iid = holder.start(machine())
    seen_by_bob = bob.store.get(iid)  # bob reads, then ann's request lands first
    ann.pause(iid, by="ann")
    bobs = bob.client.pause_step(seen_by_bob, "bob", "paused")
    assert bobs is not None and bob.client.ledger.apply_one(bobs) is False
    rec = bob.store.get(iid)
    assert (rec.status, rec.reason, rec.owner) == ("pending", None, holder.worker.id)
    assert '"by": "ann"' in (rec.pause_request or "")
    assert bob.store.history(iid) == []  # nothing paused under the holder's feet


def test_a_pause_and_a_cancel_interleaved_mid_step_leave_the_cancel_and_the_worker_alive(
        engine_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 36 item 8: a worker mid-step; ann asks to pause while bob's cancel lands just
    before ann's touch.  The cancel wins: the worker's step, finishing after it, is stale
    (not written over the cancel), the worker lives on and runs the next instance, and no
    pause request is left stored."""
    starter, holder, ann, bob = (engine_factory() for _ in range(4))
    lm.ENTERED.clear()
    lm.OPEN.clear()
    [iid] = starter.start_many(lm.gated, [{}], enqueue=True)
    caplog.set_level(logging.WARNING, logger="fsm_engine")
    worker = Background(holder)
    try:
        until(lambda: lm.ENTERED == [iid], "the worker to be mid-step")
        apply_one, cancelled = ann.client.ledger.apply_one, []

        def cancel_first(step: Any) -> bool:  # bob's cancel lands just before ann's write
            if step.record.id == iid and not cancelled:
                cancelled.append(bob.cancel(iid, operator="bob"))
            return apply_one(step)
        ann.client.ledger.apply_one = cancel_first  # type: ignore[method-assign]
        with pytest.raises(InstanceFinished):
            ann.pause(iid, by="ann")
        assert cancelled
        lm.OPEN.set()  # the worker's step finishes, after the cancel
        until(lambda: not worker.worker._running, "the worker to drop the cancelled instance")
        [more] = starter.start_many(lm.gated, [{}], enqueue=True)
        until(lambda: starter.store.get(more).final, "the same worker to run the next one")
        assert worker.thread.is_alive()
    finally:
        worker.stop()
    rec = starter.store.get(iid)
    assert (rec.status, rec.reason) == ("cancelled", "cancelled")
    assert [h.kind for h in starter.store.history(iid)] == ["cancel"]
    assert starter.store.get(more).status == "completed"
    assert starter.store.get_meta(f"pause:{iid}") is None  # no request left stored
    assert rec.pause_request is None
    # its step found stale, not refused by the store (no run broken off with an error)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


class Parent(BaseModel):
    items: list[str] = []
    outs: list[Any] = []


class Kid(BaseModel):
    item: str = ""
    n: int = 0


def kid_step(ctx: Kid) -> dict[str, Any]:
    CALLS.append(f"kid:{ctx.item}")
    return {"n": 1}


KID = Machine(name="pausing_kid", initial="work", context=Kid,
              states=[State("work", action=kid_step), State("done", final=True)],
              transitions=[Transition("next", "work", "done")])
FAMILY = Machine(
    name="pausing_family", initial="fan", context=Parent,
    states=[State("fan", fan_out=Map(items="items", machine=KID, into="outs", item_field="item")),
            State("end", final=True), State("failed", final=True, failure=True)],
    transitions=[Transition("joined", "fan", "end"), Transition("branch_failed", "fan", "failed")])


def test_pausing_a_parent_pauses_its_running_children_and_unpausing_it_ends_only_theirs(
        engine_factory: Any) -> None:
    """A fan-out parent paused while its children wait to run: each child still running is
    paused with it (its own ``pause`` row, by the same operator), so no child step runs
    and no tokens are spent; unpausing the parent ends those pauses, not one an operator
    set on a child by itself, and the family then finishes."""
    eng = engine_factory()
    iid = eng.start(FAMILY, {"items": ["x", "y", "z"]})
    asyncio.run(eng.step(iid))  # the parent's fan-out: three children, not yet run
    kids = {c.context["item"]: c.id for c in eng.store.children(iid)}
    assert sorted(kids) == ["x", "y", "z"]
    eng.pause(kids["z"], by="bob", reason="look at z first")  # paused on its own
    rec = eng.pause(iid, by="ann", reason="budget review")
    assert rec.status == "paused"
    for item in ("x", "y"):
        kid = eng.store.get(kids[item])
        assert kid.status == "paused" and kid.reason == f"paused with its parent {iid}"
        [row] = [h for h in eng.store.history(kid.id) if h.kind == "pause"]
        assert row.detail["operator"] == "ann"
    assert eng.store.get(kids["z"]).reason == "look at z first"
    asyncio.run(eng.resume())
    assert CALLS == []  # nothing of the family ran while it was paused
    eng.unpause(iid, by="ann")
    assert [eng.store.get(kids[i]).status for i in ("x", "y", "z")][2] == "paused"
    assert all(eng.store.get(kids[i]).status != "paused" for i in ("x", "y"))
    eng.unpause(kids["z"], by="bob")
    asyncio.run(eng.resume())
    final = eng.store.get(iid)
    assert final.status == "completed", (final.status, final.reason)
    assert sorted(CALLS) == ["kid:x", "kid:y", "kid:z"]


def test_a_bulk_pause_takes_the_same_path_as_one_and_pauses_a_parents_children(
        engine_factory: Any) -> None:
    """Issue 37 item 2: a bulk pause by query builds the same commit as ``Engine.pause``,
    children included: a fan-out parent paused by ``fsm pause --machine`` pauses its
    children still running (with its reason), and the bulk unpause ends those pauses."""
    eng = engine_factory()
    iid = eng.start(FAMILY, {"items": ["x", "y"]})
    asyncio.run(eng.step(iid))  # the fan-out: two children, not yet run
    where = InstanceFilter(machine="pausing_family")
    done = eng.bulk(eng.bulk_plan("pause", where), by="ops", reason="audit")
    assert done.changed == 1 and eng.store.get(iid).status == "paused"
    kids = eng.store.children(iid)
    assert {(k.status, k.reason) for k in kids} == {("paused", f"paused with its parent {iid}")}
    asyncio.run(eng.resume())
    assert CALLS == []  # nothing of the family ran while it was paused
    eng.bulk(eng.bulk_plan("unpause", where), by="ops")
    assert all(eng.store.get(k.id).status != "paused" for k in kids)
    asyncio.run(eng.resume())
    assert eng.store.get(iid).status == "completed"
