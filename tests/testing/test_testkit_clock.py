"""``fsm_engine.testing.VirtualClock``: a machine with 30 s backoffs, a 10 s timeout, a 1 h
review SLA and a deadline runs to each exit at once, with the history the real clock
gives at small delays (apart from times)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from fsm_engine import Engine
from fsm_engine.llm.scripted import Scripted
from fsm_engine.testing import VirtualClock
from tests.helpers.clock_machine import build

MODES = ("ok", "flaky", "slow", "late")
REPLIES = [{"match": "flaky", "error": "unavailable"}, {"match": "late", "error": "unavailable"},
           {"match": "ok", "text": "yes"}, {"match": "slow", "text": "late yes"}]


def _moves(engine: Engine, iid: str) -> list[tuple[Any, ...]]:
    rows = [(h.source, h.dest, h.trigger, h.kind, h.reason) for h in engine.store.history(iid)]
    tries = [(a.state, a.attempt, a.error_class) for a in engine.store.attempts(iid)]
    return rows + tries  # type: ignore[operator]


def _script(engine: Engine, iid: str) -> None:
    """Decide the flaky instance's review (approve); the others wait out their SLA."""
    if engine.store.get(iid).input.get("mode") == "flaky":
        engine.decide(engine.reviews(instance_id=iid)[0], "approve", by="t")


def _paths(engine: Engine, machine: Any, run: Any, wait_sla: Any) -> dict[str, list[Any]]:
    ids = {m: engine.start(machine, {"mode": m}, deadline_s=machine.states[0].timeout
                           if m == "late" else None) for m in MODES}
    run(engine.run_many(list(ids.values())))
    for iid in ids.values():
        _script(engine, iid)
    wait_sla()
    run(engine.run_many(list(ids.values())))
    return {m: _moves(engine, iid) for m, iid in ids.items()}


def test_every_exit_runs_at_once_and_as_on_the_real_clock(tmp_path: Path) -> None:
    vc = VirtualClock(seed=3)
    virtual = vc.engine(tmp_path / "v.db", llm=Scripted.from_replies(REPLIES), breaker=None)
    began = time.perf_counter()
    got = _paths(virtual, build(1.0), vc.run, lambda: vc.advance(3601))
    real_s = time.perf_counter() - began
    assert vc.offset > 3600 + 60  # the SLA and two 15-30 s backoffs passed, virtually
    real = Engine(str(tmp_path / "r.db"), llm=Scripted.from_replies(REPLIES), seed=3,
                  breaker=None)
    want = _paths(real, build(0.002, sla_s=0.05), asyncio.run, lambda: time.sleep(0.06))
    virtual.close()
    real.close()
    assert got == want
    ends = {m: rows[len([r for r in rows if len(r) == 5]) - 1][1] for m, rows in got.items()}
    assert ends == {"ok": "rejected", "flaky": "done", "slow": "rejected", "late": "failed"}
    reasons = {m: [r[4] for r in rows if len(r) == 5] for m, rows in got.items()}
    assert "retries_exhausted" in reasons["flaky"] and "timeout" in reasons["slow"]
    assert "deadline" in reasons["late"]
    print(f"virtual run: {real_s:.3f} s real for {vc.offset:.0f} s virtual")


def test_times_in_history_are_virtual(tmp_path: Path) -> None:
    vc = VirtualClock(start=1000.0)
    engine = vc.engine(tmp_path / "v.db", llm=Scripted.from_replies(REPLIES))
    iid = engine.start(build(1.0), {"mode": "flaky"})
    vc.run(engine.run(iid))
    rows = engine.store.history(iid)
    engine.close()
    assert rows[0].source == "ask" and rows[0].kind == "fallback"
    assert 1000.0 + 30 <= rows[0].at <= 1000.0 + 60  # two jittered 15-30 s backoffs


def test_a_sync_action_in_a_thread_holds_virtual_time() -> None:
    vc = VirtualClock()

    async def main() -> float:
        loop = asyncio.get_running_loop()
        before = loop.time()
        await asyncio.wait_for(asyncio.to_thread(time.sleep, 0.05), timeout=10)
        return loop.time() - before
    took = vc.run(main())
    assert 0.04 <= took < 10  # real time passed, the 10 s timer did not fire


def test_advance_refuses_going_back() -> None:
    with pytest.raises(ValueError):
        VirtualClock().advance(-1)


def test_rate_limit_windows_and_resume_pass_on_virtual_time(tmp_path: Path) -> None:
    from fsm_engine.policies import RateLimit
    from tests.helpers.rate_machine import MACHINE
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "v.db", llm=Scripted.from_replies([{"text": "ok"}]),
                       rate_limits={"*": RateLimit(rpm=2, window_s=60.0)})
    for n in range(5):
        engine.start(MACHINE, {"n": n})
    began = time.perf_counter()
    ended = vc.run(engine.resume())
    took = time.perf_counter() - began
    engine.close()
    assert sorted(r.status for r in ended) == ["completed"] * 5
    assert vc.offset >= 119.9  # five calls at two a minute: two windows waited out
    print(f"resume under a rate limit: {took:.3f} s real for {vc.offset:.0f} s virtual")


def test_same_seed_same_history_times_included(tmp_path: Path) -> None:
    def once(name: str, seed: int) -> list[tuple[Any, ...]]:
        vc = VirtualClock(seed=seed)
        engine = vc.engine(tmp_path / name, llm=Scripted.from_replies(REPLIES), breaker=None)
        ids = [engine.start(build(1.0), {"mode": m}, instance_id=f"i-{m}") for m in MODES]
        vc.run(engine.run_many(ids))
        rows = [(h.instance_id, h.seq, h.dest, h.at) for i in ids for h in engine.store.history(i)]
        rows += [(a.instance_id, a.attempt, a.next_at) for i in ids for a in engine.store.attempts(i)]
        engine.close()
        return rows
    first = once("a.db", 7)
    assert first == once("b.db", 7)  # the backoffs' jitter and every timestamp repeat
    assert first != once("c.db", 8)  # another seed, other backoffs


def test_schedule_ticks_a_day_apart_keep_the_engines_lease(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``advance`` firing a tick a day on renews the lease before the tick's start writes:
    the engine keeps its worker id (it rolled over, warning "lost its lease", before)."""
    from tests.helpers.start_machine import machine
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    engine.start(machine("daily"), {"n": 1})  # registers the engine's worker
    first = engine.worker.id
    engine.schedules.add("daily", machine("daily"), every="1d", input={"n": 2},
                          overlap="allow")
    with caplog.at_level("WARNING", logger="fsm_engine"):
        vc.advance(2 * 86400 + 5)
        engine.start(machine("daily"), {"n": 3})
    ids = [r.id for r in engine.store.list()]
    engine.close()
    assert engine.worker.id == first and "lost its lease" not in caplog.text
    assert sum(i.startswith("daily-") for i in ids) == 2  # at +1 d 1 s and +2 d 1 s
