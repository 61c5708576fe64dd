"""Timer edges (issue 38): refused at load where they cannot apply, armed at entry, fired
once due as an ordinary committed step, out of wait, review and fan-out states, racing
``send`` (whichever commits first wins)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from fsm_engine import DefinitionError, Engine, Machine, State, Transition
from fsm_engine.errors import FsmError
from fsm_engine.runtime import load_machine
from fsm_engine.runtime.compiled import compile_machine
from fsm_engine.runtime.kinds.replay import replay
from fsm_engine.testing.clock import VirtualClock

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
sys.path.insert(0, str(HELPERS))
import timer_machine  # noqa: E402

MODULE = str(HELPERS / "timer_machine.py")


class C(BaseModel):
    n: int = 0


def _rows(engine: Engine, iid: str, kind: str = "timer") -> list:
    return [h for h in engine.store.history(iid) if h.kind == kind]


def test_check_refuses_a_timer_out_of_a_state_that_does_not_wait_and_a_bad_delay() -> None:
    bad = Machine(name="bad", context=C, initial="a", states=[
        State("a", action=lambda c: None), State("w", wait=True), State("z", final=True)],
        transitions=[Transition("go", "a", "w"), Transition("tick", "a", "z", after=5),
                     Transition("t0", "w", "z", after=0), Transition("neg", "w", "z",
                                                                     after=timedelta(-1)),
                     Transition("mix", "w", "z", after=3), Transition("mix", "w", "a")])
    with pytest.raises(DefinitionError) as err:
        Engine(":memory:").register(bad)
    text = str(err.value)
    for part in ("'tick' (a -> z): a timer (after=) needs a state that waits",
                 "'t0' (w -> z): after must be a positive delay, not 0",
                 "'neg' (w -> z): after must be a positive delay",
                 "trigger 'mix' out of 'w' is a timer's on one edge and not on another"):
        assert part in text


def test_a_wait_timer_fires_once_due_as_a_committed_timer_step(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.nudge, {})
    rec = vc.run(engine.run(iid))
    assert (rec.state, rec.status, rec.owner) == ("wait", "waiting", None)
    entered = engine.store.history(iid)[-1]
    assert entered.detail["timers"] == {"nudge": entered.at + 60}
    assert rec.next_attempt_at == entered.at + 60
    vc.advance(59)
    assert vc.run(engine.run(iid)).state == "wait"  # not yet due: nothing fires
    assert _rows(engine, iid) == []
    vc.advance(2)
    rec = vc.run(engine.run(iid))
    assert (rec.state, rec.status) == ("expired", "completed")
    [row] = _rows(engine, iid)
    assert (row.source, row.trigger, row.dest) == ("wait", "nudge", "expired")
    assert row.detail["timer"] == {"due": entered.at + 60, "lateness_s": pytest.approx(1.0)}
    rerun = replay(compile_machine(timer_machine.nudge), rec,
                   engine.store.history(iid))
    assert rerun.divergence is None
    engine.close()


def test_a_callable_delay_is_evaluated_at_entry_and_recorded(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.called, {"at": vc.now() + 1000})
    vc.run(engine.run(iid))
    entered = engine.store.history(iid)[-1]
    assert entered.detail["timers"] == {"nudge": pytest.approx(vc.now() + 1000)}
    vc.advance(1001)
    assert vc.run(engine.run(iid)).state == "expired"
    engine.close()


def test_send_before_the_timer_wins_and_the_timer_never_fires(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.nudge, {})
    vc.run(engine.run(iid))
    rec = vc.run(engine.signal(iid, "reply"))
    assert (rec.state, rec.next_attempt_at) == ("done", None)
    vc.advance(120)
    assert engine.store.get(iid).state == "done"
    assert _rows(engine, iid) == []
    other = engine.start(timer_machine.nudge, {})
    vc.run(engine.run(other))
    vc.advance(61)
    vc.run(engine.run(other))  # the timer first: the send is refused, one line
    with pytest.raises(FsmError) as err:
        vc.run(engine.signal(other, "reply"))
    assert "not waiting" in str(err.value) and "\n" not in str(err.value)
    engine.close()


def test_a_review_timer_beside_its_sla_fires_first_and_closes_the_item(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.reviewed, {})
    rec = vc.run(engine.run(iid))
    [item] = engine.reviews()
    assert rec.next_attempt_at == pytest.approx(item.due_at - 50)  # the timer, before the SLA
    vc.advance(51)
    rec = vc.run(engine.run(iid))
    assert rec.state == "late"
    [item] = engine.store.reviews()
    assert item.status == "closed"
    engine.close()


def test_a_fan_out_timer_keeps_its_due_over_a_wake_and_cancels_the_children(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.fan, {"words": ["a", "slow"]})
    rec = vc.run(engine.run(iid))  # "a" ends at once (a wake), "slow" runs on
    entered = [h for h in engine.store.history(iid) if h.dest == "map"][-1]
    assert entered.detail["timers"] == {"give_up": entered.at + 30}
    assert (rec.state, rec.status) == ("gave_up", "completed")
    [row] = _rows(engine, iid)
    assert row.detail["timer"]["due"] == entered.at + 30  # not moved by the wake
    assert row.detail["timer"]["lateness_s"] < 1
    kids = engine.store.children(iid)
    assert sorted(k.status for k in kids) == ["cancelled", "completed"]
    engine.close()


def _fsm(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_timer_racing_send_in_two_processes_lets_exactly_one_win(tmp_path) -> None:
    """Instances whose timer is due, a ``fsm worker`` and a process sending ``reply`` to
    each at once: each instance leaves ``wait`` once, by the timer or the send, and every
    send that lost was refused in one line."""
    db = str(tmp_path / "fsm.db")
    env = {**os.environ, "FSM_DB": db, "TIMER_S": "0.5"}
    os.environ["TIMER_S"] = "0.5"
    try:
        engine = Engine(db)
        machine, _ = load_machine(MODULE + ":nudge")
        ids = engine.start_many(machine, [{} for _ in range(30)])
        asyncio.run(engine.run_many(ids))
        assert all(engine.store.get(i).status == "waiting" for i in ids)
        engine.close()
    finally:
        os.environ.pop("TIMER_S", None)
    sender = [sys.executable, "-c", (
        "import sys, time; from fsm_engine.cli import app; ids = sys.argv[1:]; "
        "time.sleep(0.45)\n"
        "for i in ids:\n"
        "    try: app(['send', i, 'reply'], standalone_mode=False); print('SENT', i)\n"
        "    except SystemExit as e: print('EXIT', i, e.code)\n"
        "    except Exception as e: print('REFUSED', i, str(e).replace(chr(10), ' '))\n"),
        *ids]
    worker = _fsm("worker", "--lease", "5", "--machines", MODULE, env=env)
    send = subprocess.Popen(sender, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = send.communicate(timeout=120)
    engine = Engine(db)
    try:
        deadline = 300
        while deadline and not all(engine.store.get(i).final for i in ids):
            deadline -= 1
            asyncio.run(asyncio.sleep(0.1))
        sent = {line.split()[1] for line in out.splitlines() if line.startswith("SENT")}
        assert "Traceback" not in err, err[-2000:]  # a lost send is refused, one line
        # one harness line per id (a send that won also prints the command's own line)
        verdicts = [line for line in out.splitlines()
                    if line.split(" ", 1)[0] in ("SENT", "REFUSED", "EXIT")]
        assert len(verdicts) == len(ids), out
        for i in ids:
            left = [h for h in engine.store.history(i) if h.source == "wait"]
            assert len(left) == 1, (i, left)
            assert (left[0].kind == "timer") == (i not in sent), (i, left[0])
            assert engine.store.get(i).state == ("done" if i in sent else "expired")
    finally:
        engine.close()
        worker.terminate()
        worker.wait(10)


# -- seen everywhere: diagrams, fsm show, coverage, fsm paths, the test kit (item 8) ------
def test_diagrams_draw_a_timer_edge_with_its_delay() -> None:
    from fsm_engine.diagram.dot import to_dot
    from fsm_engine.diagram.mermaid import to_mermaid
    from fsm_engine.diagram.model import build_graph
    graph = build_graph(timer_machine.nudge.export())
    assert 'label="nudge ⏱ after 1m"' in to_dot(graph)
    assert "nudge ⏱ after 1m" in to_mermaid(graph)
    called = build_graph(timer_machine.called.export())
    assert "nudge ⏱ after due_at()" in to_mermaid(called)


def test_coverage_counts_a_timer_fire_and_paths_walk_timer_edges(tmp_path) -> None:
    from fsm_engine.coverage import from_store
    from fsm_engine.paths import paths
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.nudge, {})
    vc.run(engine.run(iid))
    vc.advance(61)
    vc.run(engine.run(iid))
    cov = from_store(engine.store, timer_machine.nudge.export())
    taken = {(e.source, e.trigger, e.dest): n for e, n in cov.edges.items()}
    assert taken[("wait", "nudge", "expired")] == 1 and taken[("wait", "reply", "done")] == 0
    found = paths(timer_machine.nudge.export()).to_json()["paths"]
    assert ["go", "nudge"] in [p["triggers"] for p in found]
    engine.close()


def test_fsm_show_gives_a_waiting_instance_its_next_timer(tmp_path) -> None:
    from fsm_engine.views import timer_json
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.reviewed, {})
    rec = vc.run(engine.run(iid))
    shown = timer_json(rec, engine.store.history(iid))
    assert shown is not None and shown["trigger"] == "late"
    assert shown["due"] == rec.next_attempt_at
    engine.close()


def test_fsm_show_and_history_print_a_timers_times_as_times(tmp_path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh user's reading: ``fsm show`` gave the due time as epoch seconds alone and
    ``fsm history`` did not tell a timer's fire from any other move."""
    import time

    from cli import run_main
    vc = VirtualClock(start=time.time())
    db = str(tmp_path / "fsm.db")
    engine = vc.engine(db)
    iid = engine.start(timer_machine.nudge, {})
    vc.run(engine.run(iid))
    code, out, _ = run_main(["show", iid, "--db", db], capsys)
    [timer] = [line for line in out.splitlines() if line.startswith("timer: ")]
    assert code == 0 and "  (nudge due " in timer
    assert timer.endswith("(in 59 s))") or timer.endswith("(in 1 min))")
    vc.advance(61)
    vc.run(engine.run(iid))
    engine.close()
    code, out, _ = run_main(["history", iid, "--db", db, "--json"], capsys)
    rows = {r["kind"]: r for r in json.loads(out)}
    from typer.testing import CliRunner

    from fsm_engine.cli import app
    out = CliRunner().invoke(app, ["history", iid, "--db", db], env={"COLUMNS": "200"}).stdout
    assert "timer fired 1.0 s late (due " in out
    assert "timer nudge due " in out  # the row that entered ``wait`` armed it
    from fsm_engine.views import local_time, timer_note
    assert timer_note(rows["timer"]) == f"timer fired 1.0 s late (due {local_time(vc.now() - 1)})"


def test_a_case_advancing_the_clock_fires_the_timers_due_in_order() -> None:
    from fsm_engine.testing.cases import run_cases
    machine = Machine(name="twice", context=C, initial="w", states=[
        State("w", wait=True), State("bump", action=lambda c: {"n": c.n + 1}),
        State("done", final=True)], transitions=[
        Transition("tick", "w", "bump", after=10), Transition("back", "bump", "w"),
        Transition("stop", "w", "done")])
    case = {"name": "three ticks, then stop", "input": {},
            "decisions": [{"advance": 35}, {"send": "stop"}],
            "path": ["w", "bump", "w", "bump", "w", "bump", "w", "done"], "output": {"n": 3}}
    [got], _ = run_cases(machine, [case])
    assert got.ok, got.problems


def test_fsm_resume_fires_a_timer_that_is_due(tmp_path, monkeypatch, capsys) -> None:
    """``fsm resume`` once the timer is due fires it (it said "nothing to resume": a waiting
    instance was never resumable, its timer due or not).  The delay outlasts the first run
    on a loaded machine (at 0.05 s, a run slower than that fired the timer itself: CI)."""
    import time

    from cli import run_main
    module = tmp_path / "quick.py"
    module.write_text(
        "from pydantic import BaseModel\n"
        "from fsm_engine import Machine, State, Transition\n"
        "class C(BaseModel):\n    n: int = 0\n"
        "machine = Machine(name='quick', context=C, initial='a', states=[State('a'), "
        "State('w', wait=True), State('late', final=True)], transitions=["
        "Transition('go', 'a', 'w'), Transition('t', 'w', 'late', after=1.5)])\n")
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(tmp_path))
    db = str(tmp_path / "fsm.db")
    engine = Engine(db)
    iid = engine.start(str(module), {})
    rec = asyncio.run(engine.run(iid))
    engine.close()
    assert rec.status == "waiting" and rec.next_attempt_at is not None
    while time.time() <= rec.next_attempt_at:  # the CLI's clock is the real one
        time.sleep(0.01)
    code, out, err = run_main(["resume", "--db", db, "-q"], capsys)
    assert code == 0, err
    engine = Engine(db)
    assert engine.store.get(iid).state == "late", out
    engine.close()


@pytest.mark.parametrize("short", [10, lambda ctx: 10.0], ids=["constant", "callable"])
def test_of_several_timers_the_first_due_fires(tmp_path, short) -> None:
    machine = Machine(name="two", context=C, initial="a", states=[
        State("a"), State("w", wait=True), State("long", final=True),
        State("short", final=True)], transitions=[
        Transition("go", "a", "w"), Transition("slow", "w", "long", after=100),
        Transition("quick", "w", "short", after=short)])
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(machine, {})
    rec = vc.run(engine.run(iid))
    assert rec.next_attempt_at == engine.store.history(iid)[-1].at + 10
    vc.advance(200)  # both due: the one due first fires
    assert vc.run(engine.run(iid)).state == "short"
    engine.close()


def test_a_rerun_in_place_into_a_state_with_a_timer_arms_it(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(timer_machine.nudge, {})
    vc.run(engine.run(iid))
    vc.run(engine.signal(iid, "reply"))
    engine.rerun(iid, "wait", in_place=True, by="ops")
    rec = engine.store.get(iid)
    row = engine.store.history(iid)[-1]
    assert (row.kind, rec.status, rec.next_attempt_at) == ("rerun", "waiting", row.at + 60)
    vc.advance(61)
    assert vc.run(engine.run(iid)).state == "expired"
    engine.close()


def test_a_loop_cap_routed_to_a_review_with_a_timer_arms_it(tmp_path) -> None:
    from fsm_engine import fire
    from fsm_engine.definition.review import Review
    machine = Machine(name="capped", context=C, initial="a", max_transitions=3,
                      on_loop_limit="stuck", states=[
                          State("a", action=lambda c: fire("again", n=c.n + 1)),
                          State("stuck", review=Review(prompt="?", choices=["retry"])),
                          State("gave_up", final=True)],
                      transitions=[Transition("again", "a", "a"),
                                   Transition("quit", "a", "gave_up"),
                                   Transition("retry", "stuck", "a"),
                                   Transition("give_up", "stuck", "gave_up", after=10)])
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(machine, {})
    rec = vc.run(engine.run(iid))
    row = engine.store.history(iid)[-1]
    assert (rec.state, row.kind, rec.next_attempt_at) == ("stuck", "loop_limit", row.at + 10)
    vc.advance(11)
    assert vc.run(engine.run(iid)).state == "gave_up"
    engine.close()


_SOON = Machine(name="soon", context=C, initial="start",
                states=[State("start"), State("wait", wait=True), State("late", final=True)],
                transitions=[Transition("go", "start", "wait"),
                             Transition("expire", "wait", "late", after=0.3)])


def test_an_idle_worker_fires_a_timer_when_it_is_due_not_at_its_next_poll(tmp_path) -> None:
    """A worker polling every 4 s fires a timer due in 0.3 s when it falls due: its
    unfilled claim reads the next due time (``Store.next_due``) and its idle wait ends then
    (before, the fire waited for the next poll)."""
    import threading

    from fsm_engine.runtime.worker import Worker
    db = str(tmp_path / "fsm.db")
    arming = Engine(db)
    arming.register(_SOON)
    iid = arming.start(_SOON, {})
    assert asyncio.run(arming.run(iid)).status == "waiting"
    arming.close()
    engine = Engine(db)
    engine.register(_SOON)
    worker = Worker(engine, poll=4.0)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.serve(),),
                              daemon=True)
    thread.start()
    try:
        for _ in range(200):  # polled: at most 10 s
            if engine.store.get(iid).final:
                break
            threading.Event().wait(0.05)
        rec = engine.store.get(iid)
        assert (rec.state, rec.status) == ("late", "completed")
        [row] = _rows(engine, iid)
        assert row.detail["timer"]["lateness_s"] < 2  # half the poll (which it waited before)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
        engine.close()


def test_an_initial_states_callable_delay_is_evaluated_once_and_recorded(store_url) -> None:
    """An instance that starts in a state with timers has no row entering it: its first
    step records the due times (an in-place ``armed`` row, ``detail.timers``), evaluated
    once — ``fsm show`` gives the timer, the fire reads the recorded time back."""
    from fsm_engine.views import timer_json
    calls: list[float] = []

    def soon(ctx: C) -> float:
        calls.append(1.0)
        return 100.0 * len(calls)  # a different answer each time it is asked

    machine = Machine(name="first", context=C, initial="w", states=[
        State("w", wait=True), State("soon", final=True), State("late", final=True)],
        transitions=[Transition("quick", "w", "soon", after=soon),
                     Transition("slow", "w", "late", after=lambda ctx: 500.0)])
    vc = VirtualClock()
    engine = vc.engine(store_url)
    iid = engine.start(machine, {})
    rec = vc.run(engine.run(iid))
    [row] = engine.store.history(iid)
    assert (row.kind, row.source, row.dest) == ("armed", "w", "w")
    assert row.detail["timers"] == {"quick": row.at + 100, "slow": row.at + 500}
    assert (rec.status, rec.next_attempt_at) == ("waiting", row.at + 100)
    shown = timer_json(rec, engine.store.history(iid))
    assert shown == {"trigger": "quick", "due": row.at + 100, "timers": row.detail["timers"]}
    vc.advance(150)
    rec = vc.run(engine.run(iid))
    assert rec.state == "soon" and len(calls) == 1
    [fired] = _rows(engine, iid)
    assert fired.detail["timer"]["due"] == row.at + 100
    assert replay(compile_machine(machine), rec, engine.store.history(iid)).divergence is None
    engine.close()


def test_a_delayed_start_in_a_state_with_a_timer_arms_it_when_it_starts(store_url) -> None:
    """The initial state's timers count from the first step, not from the start call: a
    start delayed past the timer's delay does not fire it at once."""
    machine = Machine(name="later", context=C, initial="w", states=[
        State("w", wait=True), State("z", final=True)],
        transitions=[Transition("t", "w", "z", after=100)])
    vc = VirtualClock()
    engine = vc.engine(store_url)
    iid = engine.start(machine, {}, delay=1000)
    vc.advance(1001)
    rec = vc.run(engine.run(iid))
    assert (rec.state, rec.status, rec.next_attempt_at) == ("w", "waiting", vc.now() + 100)
    engine.close()


def test_a_fork_of_an_instance_waiting_on_a_timer_waits_a_fresh_delay(store_url) -> None:
    """A fork from the state with the timer waits its own ``after`` from when it starts
    (never what the original had left) and fires once; the original fires once, at its
    own time."""
    from fsm_engine.views import timer_json
    vc = VirtualClock()
    engine = vc.engine(store_url)
    iid = engine.start(timer_machine.nudge, {})
    vc.run(engine.run(iid))
    entered = engine.store.history(iid)[-1]
    vc.advance(40)
    fork = engine.fork(iid, from_state="wait")
    rec = vc.run(engine.run(fork))
    armed = engine.store.history(fork)[-1]
    assert (armed.kind, armed.detail["timers"]) == ("armed", {"nudge": vc.now() + 60})
    assert (rec.state, rec.status, rec.next_attempt_at) == ("wait", "waiting", vc.now() + 60)
    assert timer_json(rec, engine.store.history(fork))["due"] == vc.now() + 60
    vc.advance(21)  # the original's due, not the fork's
    assert vc.run(engine.run(iid)).state == "expired"
    assert vc.run(engine.run(fork)).state == "wait"
    vc.advance(40)
    assert vc.run(engine.run(fork)).state == "expired"
    vc.advance(100)
    for each in (iid, fork):
        with pytest.raises(FsmError):
            vc.run(engine.run(each))  # finished: nothing fires again
    [fired] = _rows(engine, iid)
    assert fired.detail["timer"]["due"] == entered.at + 60
    [fired] = _rows(engine, fork)
    assert fired.detail["timer"]["due"] == armed.at + 60
    engine.close()


def test_a_restarted_delayed_start_arms_its_initial_states_timer_when_it_starts(
        tmp_path) -> None:
    machine = Machine(name="again", context=C, initial="w", states=[
        State("w", wait=True), State("z", final=True)],
        transitions=[Transition("t", "w", "z", after=100)])
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    iid = engine.start(machine, {}, delay=1000)
    engine.cancel(iid)
    assert engine.restart(iid).status == "scheduled"
    vc.advance(1000)
    rec = vc.run(engine.run(iid))
    row = engine.store.history(iid)[-1]
    assert (row.kind, row.detail["timers"]) == ("armed", {"t": vc.now() + 100})
    assert (rec.status, rec.next_attempt_at) == ("waiting", vc.now() + 100)
    engine.close()


def test_a_due_time_already_past_does_not_end_an_idle_wait_at_once(tmp_path) -> None:
    """The due time an unfilled claim read may have passed by the next idle wait (its
    instance claimed meanwhile, or every slot full since): that wait still lasts until a
    wake, a free slot or the poll — it does not return at once, round after round (a busy
    loop while the worker is full)."""
    from fsm_engine.runtime.worker import Worker
    engine = Engine(str(tmp_path / "fsm.db"))
    worker = Worker(engine, poll=2.0, schedules=False)  # (its store wait ends by then)

    async def idle_once() -> None:
        worker._stopping, worker._wake = asyncio.Event(), asyncio.Event()
        worker._due_at = engine.clock() - 5.0  # read before; due since
        try:
            with pytest.raises(TimeoutError):  # nothing wakes it within half a second
                await asyncio.wait_for(worker._idle(), 0.5)
        finally:
            if worker._waiter is not None:
                worker._waiter.cancel()
    try:
        asyncio.run(idle_once())
    finally:
        engine.close()
