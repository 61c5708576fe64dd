"""A worker that lost its lease comes back: the store refuses its renewal, it drops every
instance it ran at once, goes on under a new id and claims work again; the worker that
took its instances over finishes them, each step once (both backends).

Worker A runs on an event loop of its own, in a thread; the test blocks that loop (as a
long GC pause or a SIGSTOP would: A's heartbeat thread sees the loop silent and stops
renewing) until worker B has taken A's instances over, then lets it go on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import lease_machine as lm
import pytest
from background_worker import Background, until

from fsm_engine.runtime.fleet.liveness import live_ids

LEASE = 1.0


def test_a_worker_that_lost_its_lease_goes_on_under_a_new_id(engine_factory,
                                                             caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    starter = engine_factory()
    a, b = engine_factory(lease_seconds=LEASE), engine_factory(lease_seconds=LEASE)
    store = starter.store
    lm.ENTERED.clear()
    lm.OPEN.clear()
    ids = starter.start_many(lm.gated, [{}] * 4, enqueue=True)
    caplog.set_level(logging.WARNING, logger="fsm_engine")
    first = Background(a)
    try:
        until(lambda: sorted(set(lm.ENTERED)) == sorted(ids), "A to hold all four mid-step")
        old = a.worker.id
        resume = first.block()  # A stalls past its lease; its heartbeat stops renewing
        second = Background(b)
        try:
            until(lambda: {store.get(i).owner for i in ids} == {b.worker.id}, "B's takeover")
            resume.set()
            until(lambda: a.worker.id != old and not first.worker._running, "A to drop them")
            assert len(lm.ENTERED) == 8  # A's steps stopped; B's run, once each
            lm.OPEN.set()
            until(lambda: all(store.get(i).final for i in ids), "B to finish them")
        finally:
            second.stop()
        more = starter.start_many(lm.gated, [{}] * 3, enqueue=True)
        until(lambda: all(store.get(i).final for i in more), "A, under its new id, to run more")
        assert first.worker.completed == 3 and second.worker.completed == 4
        until(lambda: old not in {w.id for w in store.workers()}, "A's old row to go")
        assert a.worker.id in live_ids(store.workers(), time.time(), LEASE)
    finally:
        first.stop()
    for iid in ids:  # one takeover, one step: nothing of A's committed after it lost them
        rows = store.history(iid)
        assert [(h.kind, h.source, h.dest) for h in rows] == [
            ("recovery", "hold", "hold"), ("transition", "hold", "done")], iid
        assert (rows[0].detail["recovery"]["from"], rows[0].detail["recovery"]["to"]) == (
            old, b.worker.id)
    assert all([h.kind for h in store.history(i)] == ["transition"] for i in more)
    lost = [r.getMessage() for r in caplog.records if "lost its lease" in r.getMessage()]
    assert len(lost) == 1 and old in lost[0] and a.worker.id in lost[0], lost


def test_a_local_run_that_lost_its_lease_takes_its_instance_back(engine_factory) -> None:
    """``Engine.run`` (``fsm run``), its loop stalled past the lease with nobody else
    about: the run drops the step under the old id, takes the instance over under the new
    one (a recovery row between the two ids) and finishes it."""
    engine = engine_factory(lease_seconds=LEASE)
    store = engine.store
    lm.ENTERED.clear()
    lm.OPEN.clear()
    iid = engine.start(lm.gated, {})
    loop = asyncio.new_event_loop()
    done = loop.create_task(engine.run(iid))
    thread = threading.Thread(target=loop.run_until_complete, args=(done,), daemon=True)
    thread.start()
    try:
        until(lambda: lm.ENTERED == [iid], "the step to start")
        old = engine.worker.id
        resume = threading.Event()
        loop.call_soon_threadsafe(resume.wait, 60)
        until(lambda: all(w.lease_until < time.time() for w in store.workers()),
              "the lease to run out")
        resume.set()
        until(lambda: len(lm.ENTERED) == 2, "the step to run again under the new id")
        lm.OPEN.set()
    finally:
        lm.OPEN.set()
        resume.set()
        thread.join(30)
        engine.ownership.stop_heartbeat()
        loop.run_until_complete(asyncio.sleep(0))  # the heartbeat task's cancellation
        loop.close()
    assert done.result().status == "completed" and engine.worker.id != old
    rows = store.history(iid)
    assert [(h.kind, h.detail.get("recovery", {}).get("from")) for h in rows] == [
        ("recovery", old), ("transition", None)]
    assert rows[0].detail["recovery"]["to"] == engine.worker.id
