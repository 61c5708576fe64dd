"""A give-back of an instance whose run broke off never lands on a claim made since
(matrix finding A2: in ``agent-call-pg_restart-*-postgres``, about 1 run in 80, a tool call
ran three times after a database restart).

A run that meets a store error (a dropped connection) gives its instance back: the runner
at once, the worker's next fill again (its orphans), the heartbeat later when the store
refused (``Ownership.unreleased``), and the heartbeat gives back what it finds held and
idle. Each of these used to land on a claim of the same instance made in between (a fill's
claim runs in a thread; the heartbeat works from a snapshot of the loop's tasks): the new
run's commit was refused and its action ran once more. Both backends, the store's own
calls; one refused release and one dropped commit are simulated.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from procs import wait_until
from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.errors import StoreError
from fsm_engine.runtime.worker import Worker


class Ctx(BaseModel):
    n: int = 0


def _go(ctx: Ctx) -> dict[str, int]:
    return {"n": 1}


FLOW = Machine("flow", context=Ctx, states=[State("init", action=_go), State("done", final=True)],
               transitions=[Transition("go", "init", "done")], initial="init")


def _claimed_again(engine, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """An instance whose run broke off (its release refused once: kept for the heartbeat),
    then given back by the worker's fill and claimed again; its id and new version."""
    own = engine.ownership
    own.register()
    (iid,) = engine.start_many(FLOW, [{}], enqueue=True)
    assert [r.id for r in own.claim(10)] == [iid]
    store_release = engine.store.release

    def refused(*args: object, **kwargs: object) -> None:
        raise StoreError("database restarting")
    monkeypatch.setattr(engine.store, "release", refused)
    own.release([iid])  # the run broke off while the database restarted
    monkeypatch.setattr(engine.store, "release", store_release)
    assert own.unreleased == {iid}
    engine.ledger.release(own.id, [iid])  # the worker's fill gives its orphan back ...
    again = own.claim(10)  # ... and claims it again, before any task runs it
    assert [r.id for r in again] == [iid]
    return iid, again[0].version


def test_a_retried_release_does_not_undo_a_claim_made_since(engine_factory,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    engine = engine_factory()
    iid, version = _claimed_again(engine, monkeypatch)
    engine.ownership.check([])  # the heartbeat, its snapshot of the tasks from before
    rec = engine.store.get(iid)
    assert (rec.owner, rec.version) == (engine.ownership.id, version)
    assert not engine.ownership.unreleased


def test_an_idle_give_back_does_not_undo_a_claim_made_since(engine_factory) -> None:
    engine = engine_factory()
    own = engine.ownership
    own.release_idle = True
    own.register()
    (iid,) = engine.start_many(FLOW, [{}], enqueue=True)
    assert [r.id for r in own.claim(10)] == [iid]
    own.check([])  # held, and no task runs it (its run broke off): idle once
    engine.ledger.release(own.id, [iid])  # the worker's fill gives it back ...
    again = own.claim(10)  # ... and claims it again; no task runs it yet
    assert [r.id for r in again] == [iid]
    own.check([])  # the heartbeat, its snapshot of the tasks from before
    rec = engine.store.get(iid)
    assert (rec.owner, rec.version) == (own.id, again[0].version)



def test_a_claim_whose_task_has_not_started_is_not_given_back(engine_factory) -> None:
    """A fill's claim runs in a thread; its tasks start when the event loop next runs.
    With the loop starved (issue 36: matrix cells under load ran a step twice with no
    takeover), two heartbeat checks can pass between the claim and the task: the
    instance is held and no task runs it, yet it is not idle, it is starting. Giving it
    back let another worker run the step while this one ran it too."""
    engine = engine_factory()
    own = engine.ownership
    own.release_idle = True
    own.register()
    (iid,) = engine.start_many(FLOW, [{}], enqueue=True)
    (claimed,) = own.claim(10)
    own.check([])  # the loop has not run the claimed instance's task yet ...
    own.check([])  # ... nor at the next check
    rec = engine.store.get(iid)
    assert (rec.owner, rec.version) == (own.id, claimed.version)
    own.started(iid)  # its task ran and ended; held with no task at two checks: given back
    own.check([])
    own.check([])
    assert engine.store.get(iid).owner is None

# -- a worker's orphan, claimed again by the fill that ran while its run broke off ---------

ENTERED: list[int] = []
GO = [threading.Event(), threading.Event()]


def _held(ctx: Ctx) -> dict[str, int]:
    ENTERED.append(1)
    assert GO[len(ENTERED) - 1].wait(30)
    return {"n": ctx.n + 1}


HELD = Machine("held", context=Ctx, states=[State("init", action=_held),
                                            State("done", final=True)],
               transitions=[Transition("go", "init", "done")], initial="init")


def _until(predicate: Callable[[], bool], what: str) -> None:
    wait_until(predicate, 30, what, interval=0.01)


def test_an_orphan_claimed_again_meanwhile_is_not_given_back(engine_factory,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """The run's commit meets a dropped connection: the run gives the instance back (the
    runner at once, the worker's next fill again, as an orphan). A fill of the worker's
    whose claim runs in its thread meanwhile claims the instance again and starts it; the
    next fill must not give that new claim back (its commit would be refused and the
    action run a third time)."""
    ENTERED.clear()
    for event in GO:
        event.clear()
    engine = engine_factory()
    (iid,) = engine.start_many(HELD, [{}], enqueue=True)
    store, released, claims = engine.store, threading.Event(), [0]
    commit, release = store.commit, store.release

    def dropped(steps: Any) -> list[bool]:
        if any(s.record.id == iid for s in steps) and len(ENTERED) == 1:
            raise StoreError("server closed the connection unexpectedly")
        return commit(steps)

    def releasing(worker_id: str, ids: Any = None, *, now: float) -> Any:
        out = release(worker_id, ids, now=now)
        if ids and iid in ids:
            released.set()
        return out
    monkeypatch.setattr(store, "commit", dropped)
    monkeypatch.setattr(store, "release", releasing)
    worker = Worker(engine, concurrency=4, poll=0.05)
    real_claim = worker._claim

    def claim(running: Any) -> Any:  # a fill's claim, in its thread
        claims[0] += 1
        if len(ENTERED) == 1 and not released.is_set():
            assert released.wait(30)  # overlaps the broken run's give-back
        return real_claim(running)
    monkeypatch.setattr(worker, "_claim", claim)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.serve(),),
                              daemon=True)
    thread.start()
    try:
        _until(lambda: len(ENTERED) == 1, "the first run to start")
        _until(lambda: claims[0] >= 2, "a fill's claim to be under way")
        GO[0].set()  # its commit meets the dropped connection
        _until(lambda: len(ENTERED) == 2, "the instance to be claimed again and run")
        seen = claims[0]
        _until(lambda: claims[0] >= seen + 2, "the worker's next fills")
        rec = store.get(iid)
        assert rec.owner == worker.id, "the new claim was given back under its run"
        GO[1].set()
        _until(lambda: store.get(iid).final, "the instance to end")
    finally:
        for event in GO:
            event.set()
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    assert len(ENTERED) == 2 and store.get(iid).context["n"] == 1
