"""Schedules in one process (issue 38, item 2): ticks, ids, catch-up, overlap, racing
engines, a tick cut between its start and its advance, pause/resume, backfill, and the
``VirtualClock`` firing ticks in order.  Real SQLite files; the fleet of real worker
processes is ``tests/runtime/fleet/test_schedule_fleet.py``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import held_machine
import pytest
import tick_machine

from fsm_engine import Engine
from fsm_engine.errors import InvalidInput, StoreError
from fsm_engine.runtime import schedules as sched
from fsm_engine.runtime.schedule_spec import tick_id
from fsm_engine.testing import VirtualClock

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


class Clock:
    """A clock the test moves by hand (epoch seconds)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(tmp_path: Path, clock: Clock) -> Any:
    eng = Engine(str(tmp_path / "fsm.db"), clock=clock)
    yield eng
    eng.close()


def ids(engine: Engine) -> list[str]:
    return sorted(r.id for r in engine.store.list())


def test_each_interval_tick_starts_one_instance_named_by_its_tick(engine, clock) -> None:
    row = engine.schedules.add("two", tick_machine.machine, every="2s", input={"label": "x"},
                               overlap="allow")
    assert (row.anchor, row.next_fire) == (T0 + 1, T0 + 3)  # the first tick after the add
    assert engine.schedules.fire_due() == T0 + 3 and ids(engine) == []
    for t in (T0 + 3, T0 + 3.5, T0 + 5, T0 + 5):  # each tick once, however often it is asked
        clock.t = t
        engine.schedules.fire_due()
    assert ids(engine) == [tick_id("two", T0 + 3), tick_id("two", T0 + 5)] == [
        "two-20231114T221323Z", "two-20231114T221325Z"]
    rec = engine.store.get("two-20231114T221325Z")
    assert (rec.status, rec.owner, rec.context["label"]) == ("pending", None, "x")
    assert rec.start_key == "schedule:two:2023-11-14T22:13:25.000Z"  # its idempotency key
    assert engine.start(tick_machine.machine, {"label": "x"}, key=rec.start_key) == rec.id
    got = engine.schedules.get("two")
    assert (got.next_fire, got.last_fire, got.last_instance) == (T0 + 7, T0 + 5, rec.id)


def test_a_cron_with_seconds_ticks_in_its_zone(engine, clock) -> None:
    # 02:30 Paris every day, seconds first; 2023-11-14 22:13 UTC is 23:13 in Paris
    row = engine.schedules.add("night", tick_machine.machine, cron="0 30 2 * * *",
                               tz="Europe/Paris")
    assert row.next_fire == 1_700_011_800.0  # 2023-11-15T01:30:00Z = 02:30 CET
    clock.t = row.next_fire
    engine.schedules.fire_due()
    assert ids(engine) == ["night-20231115T013000Z"]


@pytest.mark.parametrize(("catchup", "started", "missed"), [
    ("none", [], 4), ("latest", [2401], 3), ("all", [601, 1201, 1801, 2401], 0)])
def test_catchup_decides_what_missed_ticks_do(engine, clock, catchup: str,
                                              started: list[int], missed: int) -> None:
    engine.schedules.add("s", tick_machine.machine, every="10m", catchup=catchup,
                         overlap="allow")  # ticks at T0 + 1 + 600 n
    clock.t = T0 + 2401 + 120  # no worker ran: 4 ticks due, the newest 2 min late
    engine.schedules.fire_due()
    assert ids(engine) == [tick_id("s", T0 + t) for t in started]
    row = engine.schedules.get("s")
    assert (row.missed, row.next_fire) == (missed, T0 + 3001)  # then the next future tick


def test_catchup_none_starts_the_newest_tick_while_it_is_on_time(engine, clock) -> None:
    engine.schedules.add("s", tick_machine.machine, every="1s")
    clock.t = T0 + 12.5  # ticks 2..12 due: 12 is on time, 2..11 were missed
    engine.schedules.fire_due()
    assert ids(engine) == [tick_id("s", T0 + 12)]
    assert engine.schedules.get("s").missed == 10


def test_catchup_all_starts_at_most_the_newest_hundred(engine, clock) -> None:
    engine.schedules.add("s", tick_machine.machine, every="1s", catchup="all",
                         overlap="allow")
    clock.t = T0 + 2 + 250
    engine.schedules.fire_due()
    got = ids(engine)
    assert len(got) == sched.CATCHUP_MAX and got[0] == tick_id("s", T0 + 153)
    assert engine.schedules.get("s").missed == 151  # ticks 2..152


@pytest.mark.parametrize("overlap", ["skip", "queue", "allow"])
def test_overlap_decides_what_a_tick_does_while_the_last_one_runs(engine, clock,
                                                                  overlap: str) -> None:
    engine.schedules.add("h", held_machine.machine, every="10s", overlap=overlap)
    clock.t = T0 + 11
    engine.schedules.fire_due()
    first = tick_id("h", T0 + 11)
    assert ids(engine) == [first]  # it waits in ``hold``: still running at the next tick
    clock.t = T0 + 21
    engine.schedules.fire_due()
    row = engine.schedules.get("h")
    if overlap == "skip":
        assert ids(engine) == [first] and (row.skipped, row.next_fire) == (1, T0 + 31)
    elif overlap == "queue":
        assert ids(engine) == [first] and row.next_fire == T0 + 21  # still due
        clock.t = T0 + 25
        engine.cancel(first)  # the last one ends: the queued tick starts
        engine.schedules.fire_due()
        assert ids(engine) == [first, tick_id("h", T0 + 21)]
    else:
        assert ids(engine) == [first, tick_id("h", T0 + 21)]


def test_engines_racing_for_the_same_ticks_start_one_instance_each(tmp_path, clock) -> None:
    url = str(tmp_path / "fsm.db")
    engines = [Engine(url, clock=clock) for _ in range(4)]
    try:
        engines[0].schedules.add("s", tick_machine.machine, every="1s", catchup="all",
                                 overlap="allow")
        clock.t = T0 + 2 + 20
        gate = threading.Barrier(len(engines))
        errors: list[BaseException] = []

        def fire(engine: Engine) -> None:
            gate.wait()
            try:
                engine.schedules.fire_due()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        threads = [threading.Thread(target=fire, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        engines[0].schedules.fire_due()  # one stopped by a racer's move: finished by anyone
        assert ids(engines[0]) == sorted(tick_id("s", T0 + 2 + i) for i in range(21))
        assert engines[0].schedules.get("s").next_fire == T0 + 23
    finally:
        for e in engines:
            e.close()


def test_a_tick_cut_between_its_start_and_its_advance_starts_once(engine, clock,
                                                                 monkeypatch) -> None:
    engine.schedules.add("s", tick_machine.machine, every="1s")
    clock.t = T0 + 2.2
    real = engine.store.update_schedules
    calls: list[int] = []

    def fail_the_advance(changes: Any) -> list[bool]:
        calls.append(len(changes))
        if len(calls) == 2:  # 1: the claim; 2: the advance, after the start
            raise StoreError("connection lost")
        return real(changes)
    monkeypatch.setattr(engine.store, "update_schedules", fail_the_advance)
    with pytest.raises(StoreError):
        engine.schedules.fire_due()
    assert ids(engine) == [tick_id("s", T0 + 2)]
    assert engine.schedules.get("s").next_fire == T0 + 2  # not advanced: still due
    clock.t = T0 + 2.5
    engine.schedules.fire_due()  # (any worker) the same tick again: found, advanced
    assert ids(engine) == [tick_id("s", T0 + 2)]
    row = engine.schedules.get("s")
    assert (row.next_fire, row.last_instance) == (T0 + 3, tick_id("s", T0 + 2))


def test_pause_resume_and_delete(engine, clock) -> None:
    engine.schedules.add("s", tick_machine.machine, every="1s")
    assert engine.schedules.pause("s").paused and engine.schedules.pause("s").paused
    clock.t = T0 + 30
    assert engine.schedules.fire_due() is None and ids(engine) == []
    row = engine.schedules.resume("s")
    assert not row.paused and row.next_fire == T0 + 31  # nothing of the pause caught up
    engine.schedules.delete("s")
    assert engine.schedules.list() == []
    for action in (engine.schedules.pause, engine.schedules.resume, engine.schedules.delete,
                   engine.schedules.get):
        with pytest.raises(InvalidInput, match="no schedule named 's'"):
            action("s")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"every": "2s", "cron": "* * * * *"}, "exactly one of"),
    ({}, "exactly one of"),
    ({"cron": "* * *"}, "expected 5 fields"),
    ({"cron": "99 * * * *"}, "out of range"),
    ({"every": "0s"}, "1ms to 366d"),
    ({"every": "-2s"}, "expected a duration"),
    ({"every": "2s", "tz": "Nowhere/Land"}, "unknown time zone"),
    ({"every": "2s", "overlap": "maybe"}, "--overlap 'maybe'"),
    ({"every": "2s", "catchup": "some"}, "--catchup 'some'"),
    ({"every": "2s", "input": {"label": 5}}, "input does not fit"),
])
def test_bad_schedules_are_refused_and_nothing_is_stored(engine, kwargs: dict,
                                                         message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        engine.schedules.add("s", tick_machine.machine, **kwargs)
    assert engine.schedules.list() == []


def test_a_name_is_unique_and_of_plain_characters(engine) -> None:
    engine.schedules.add("s", tick_machine.machine, every="1s")
    with pytest.raises(InvalidInput, match="schedule 's' exists"):
        engine.schedules.add("s", tick_machine.machine, every="5s")
    with pytest.raises(InvalidInput, match="schedule name"):
        engine.schedules.add("../s", tick_machine.machine, every="5s")
    assert [(r.name, r.every_s) for r in engine.schedules.list()] == [("s", 1.0)]


def test_backfill_starts_each_past_tick_once(engine, clock) -> None:
    engine.schedules.add("s", tick_machine.machine, every="1s", overlap="allow")
    clock.t = T0 + 5
    engine.schedules.fire_due()  # tick 5 live
    fired = engine.schedules.backfill("s", T0 + 2, T0 + 5)
    assert [(f.instance_id, f.new) for f in fired] == [
        (tick_id("s", T0 + 2), True), (tick_id("s", T0 + 3), True),
        (tick_id("s", T0 + 4), True), (tick_id("s", T0 + 5), False)]
    assert [f.new for f in engine.schedules.backfill("s", T0 + 2, T0 + 5)] == [False] * 4
    with pytest.raises(InvalidInput, match="in the future"):
        engine.schedules.backfill("s", T0, T0 + 60)
    with pytest.raises(InvalidInput, match="more than 1000 ticks"):
        engine.schedules.backfill("s", T0 - 5000, T0)
    assert len(ids(engine)) == 4


def test_a_virtual_clock_fires_every_tick_in_order_when_advanced(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    try:
        engine.schedules.add("s", tick_machine.machine, every="2s", overlap="allow")
        vc.advance(60)  # catchup none: a jump is time passing, not downtime
        got = [(r.id, r.created_at) for r in engine.store.list()]
        assert len(got) == 29  # ticks at T0 + 3, 5, … 59: none lost to the jump
        assert all(tick_id("s", at) == iid for iid, at in got)  # each started at its tick
        vc.run(engine.resume())
        assert {r.status for r in engine.store.list()} == {"completed"}
    finally:
        engine.close()


def test_a_virtual_clock_goes_past_a_tick_queued_behind_a_running_instance(tmp_path) -> None:
    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db")
    try:
        engine.schedules.add("h", held_machine.machine, every="2s", overlap="queue")
        vc.advance(10)  # tick 3 starts; tick 5 waits behind it (it holds): no endless loop
        assert ids(engine) == [tick_id("h", vc.start + 3)]
        assert engine.schedules.get("h").next_fire == vc.start + 5
        engine.cancel(tick_id("h", vc.start + 3))
        vc.advance(1)  # at the next look: of the ticks that waited (5, 7, 9), catchup none
        assert ids(engine)[-1] == tick_id("h", vc.start + 9)  # starts the newest
        assert engine.schedules.get("h").missed == 2
    finally:
        engine.close()


def test_a_schedule_this_worker_may_not_load_is_left_to_others(tmp_path, clock, monkeypatch,
                                                               caplog) -> None:
    url = str(tmp_path / "fsm.db")
    adder = Engine(url, clock=clock)
    adder.schedules.add("theirs", tick_machine.machine, every="1s", overlap="allow")
    adder.schedules.add("ours", held_machine.machine, every="1s", overlap="allow")
    adder.close()
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(tmp_path))  # tick_machine's file is outside
    worker = Engine(url, clock=clock)
    try:
        worker.register(held_machine.machine)  # what this worker runs
        for t in (T0 + 2, T0 + 3):
            clock.t = t
            worker.schedules.fire_due()
        assert ids(worker) == [tick_id("ours", T0 + 2), tick_id("ours", T0 + 3)]
        assert worker.schedules.get("theirs").next_fire == T0 + 2  # due, for another worker
        assert caplog.text.count("schedule theirs left to other workers") == 1
    finally:
        worker.close()


def test_start_many_with_a_key_per_input_is_all_or_none(engine) -> None:
    """What a batch of ticks starts with (``Engine.start_many(keys=...)``)."""
    from fsm_engine.errors import StartKeyTaken
    made = engine.start_many(tick_machine.machine, [{}, {}], keys=["k1", "k2"], enqueue=True)
    assert [engine.store.get(i).start_key for i in made] == ["k1", "k2"]
    with pytest.raises(StartKeyTaken):
        engine.start_many(tick_machine.machine, [{}, {}], keys=["k3", "k2"], enqueue=True)
    with pytest.raises(InvalidInput, match="1 start keys for 2 inputs"):
        engine.start_many(tick_machine.machine, [{}, {}], keys=["k4"], enqueue=True)
    assert sorted(r.start_key for r in engine.store.list()) == ["k1", "k2"]  # nothing else


def _tamper(db: str, sql: str) -> None:
    import sqlite3
    conn = sqlite3.connect(db)
    conn.execute(sql)
    conn.commit()
    conn.close()


def test_a_stored_schedule_gone_bad_is_left_and_the_others_fire(tmp_path, clock,
                                                                caplog) -> None:
    db = str(tmp_path / "fsm.db")
    engine = Engine(db, clock=clock)
    try:
        engine.schedules.add("bad", tick_machine.machine, cron="* * * * * *")
        engine.schedules.add("good", tick_machine.machine, every="1s")
        _tamper(db, "UPDATE schedules SET cron = 'not a cron', tz = 'Nowhere/Land' "
                    "WHERE name = 'bad'")
        clock.t = T0 + 2
        engine.schedules.fire_due()
        assert ids(engine) == [tick_id("good", T0 + 2)]
        assert "schedule bad left to other workers: unreadable" in caplog.text
    finally:
        engine.close()


def test_a_worker_goes_on_claiming_when_a_schedule_row_is_unreadable(tmp_path,
                                                                     caplog) -> None:
    from background_worker import Background, until
    db = str(tmp_path / "fsm.db")
    engine = Engine(db)
    engine.schedules.add("bad", tick_machine.machine, every="1h")
    _tamper(db, "UPDATE schedules SET input = '[1, 2', next_fire = 0 WHERE name = 'bad'")
    [iid] = engine.start_many(tick_machine.machine, [{}], enqueue=True)
    bg = Background(engine)
    try:
        until(lambda: engine.store.get(iid).status == "completed", "the instance to run")
    finally:
        bg.stop()
        engine.close()
    assert "schedules not fired" in caplog.text and "is not JSON" in caplog.text
