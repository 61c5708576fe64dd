"""How an instance starts (issue 38, ``runtime.start_options``): once per key, later, after
a burst, ahead of others; on both backends, through the engine."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from start_machine import MACHINE, machine
from start_race import race

from fsm_engine import open_store
from fsm_engine.errors import InvalidInput, StartConflict
from fsm_engine.store.records import AGING_S
from fsm_engine.testing import VirtualClock


# -- idempotent start --------------------------------------------------------------------
def test_a_second_start_with_the_key_returns_the_first_and_starts_nothing(
        engine_factory: Callable[..., Any]) -> None:
    engine = engine_factory()
    first = engine.start(MACHINE, {"n": 1}, key="order-42")
    again = engine.start(MACHINE, {"n": 1}, key="order-42")
    assert again == first
    assert [r.id for r in engine.store.list()] == [first]
    assert engine.store.get(first).start_key == "order-42"


def test_the_key_with_another_input_is_refused_naming_the_first(
        engine_factory: Callable[..., Any]) -> None:
    engine = engine_factory()
    first = engine.start(MACHINE, {"n": 1}, key="order-42")
    with pytest.raises(StartConflict) as info:
        engine.start(MACHINE, {"n": 2}, key="order-42")
    assert info.value.instance_id == first and first in str(info.value)
    assert "\n" not in str(info.value)
    assert [r.id for r in engine.store.list()] == [first]


def test_keys_are_per_machine_and_plain_starts_take_none(
        engine_factory: Callable[..., Any]) -> None:
    engine = engine_factory()
    a = engine.start(MACHINE, {"n": 1}, key="k")
    b, c = engine.start(MACHINE, {"n": 1}), engine.start(MACHINE, {"n": 1})
    assert len({a, b, c}) == 3
    assert engine.store.get(b).start_key is None
    assert engine.start(machine("other"), {"n": 2}, key="k") not in (a, b, c)


def test_a_keyed_start_runs_as_a_plain_one(engine_factory: Callable[..., Any]) -> None:
    import asyncio
    engine = engine_factory()
    iid = engine.start(MACHINE, {"n": 3}, key="k")
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.context["total"]) == ("completed", 3)
    assert engine.start(MACHINE, {"n": 3}, key="k") == iid  # still: it ended, the key holds


@pytest.mark.slow
def test_concurrent_keyed_starts_from_8_processes_make_one_instance(store_url: str) -> None:
    ids = race(store_url, "key", 8)
    store = open_store(store_url)
    try:
        assert [r.id for r in store.list()] == [ids[0]]
    finally:
        store.close()
    assert set(ids) == {ids[0]}  # every process was handed the one instance


# -- bad options: one line, nothing written ----------------------------------------------
PAST = datetime(2001, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("options", "words"), [
    ({"key": ""}, "start key is 1 to 200"),
    ({"key": "k" * 201}, "start key is 1 to 200"),
    ({"delay": -5}, "start delay must be 0 to"),
    ({"delay": float("nan")}, "start delay must be a number"),
    ({"delay": 5, "at": datetime.now(UTC) + timedelta(hours=1)}, "not both"),
    ({"at": datetime(2100, 1, 1)}, "needs its time zone"),  # noqa: DTZ001 - the point
    ({"at": PAST}, "has passed"),
    ({"at": datetime(9999, 12, 31, tzinfo=UTC)}, "is more than 315360000 seconds"),
    ({"priority": 1001}, "priority is an integer from -1000 to 1000"),
    ({"priority": True}, "priority is an integer"),
    ({"debounce_key": "d"}, "needs both its key and its window"),
    ({"debounce": 30}, "needs both its key and its window"),
    ({"debounce_key": "d", "debounce": 30, "max_wait": 10}, "shorter than its window"),
    ({"debounce_key": "d", "debounce": 30, "key": "k"}, "takes no start key"),
])
def test_bad_start_options_are_refused_in_one_line_writing_nothing(
        engine_factory: Callable[..., Any], options: dict[str, Any], words: str) -> None:
    engine = engine_factory()
    with pytest.raises(InvalidInput) as info:
        engine.start(MACHINE, {"n": 1}, **options)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert engine.store.list() == []


def test_a_key_or_debounce_applies_to_one_input(engine_factory: Callable[..., Any]) -> None:
    from fsm_engine.runtime.start_options import check
    engine = engine_factory()
    with pytest.raises(InvalidInput, match="applies to one input, not 2"):
        engine.start_many(MACHINE, [{"n": 1}, {"n": 2}], options=check(0.0, key="k"))
    assert engine.store.list() == []


# -- delayed start -------------------------------------------------------------------------
def _vc_engine(vc: VirtualClock, store_url: str) -> Any:
    return vc.engine(store_url)


def test_a_delayed_start_waits_scheduled_then_runs_when_due(store_url: str) -> None:
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    start = vc.now()
    iid = engine.start(MACHINE, {"n": 2}, delay=3600)
    rec = engine.store.get(iid)
    assert (rec.status, rec.owner, rec.next_attempt_at) == ("scheduled", None, start + 3600)
    assert vc.run(engine.resume()) == []  # not due: no claim takes it, not even a resume
    assert engine.store.get(iid).status == "scheduled"
    vc.advance(3600)
    [done] = vc.run(engine.resume())
    assert (done.id, done.status, done.context["total"]) == (iid, "completed", 2)
    assert engine.store.history(iid)[0].at >= start + 3600


def test_running_a_delayed_start_waits_for_its_time_on_the_clock(store_url: str) -> None:
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    due = datetime.fromtimestamp(vc.now() + 90, tz=UTC)
    iid = engine.start(MACHINE, {"n": 1}, at=due)
    rec = vc.run(engine.run(iid))  # the virtual clock jumps to the due time at once
    assert rec.status == "completed" and vc.now() >= due.timestamp()
    assert engine.store.history(iid)[0].at == pytest.approx(due.timestamp(), abs=1)


def test_a_delayed_start_is_cancellable_before_it_is_due(store_url: str) -> None:
    from fsm_engine.errors import InstanceFinished
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    iid = engine.start(MACHINE, {"n": 1}, delay=60)
    assert engine.cancel(iid).status == "cancelled"
    vc.advance(120)
    assert vc.run(engine.resume()) == []
    with pytest.raises(InstanceFinished):
        vc.run(engine.run(iid))
    assert engine.store.history(iid)[-1].dest == "work"  # only its cancel row, never a step


# -- debounce ------------------------------------------------------------------------------
def test_a_burst_of_debounced_starts_runs_once_with_the_latest_input(store_url: str) -> None:
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    first_at = vc.now()
    ids = set()
    for n in (1, 2, 3):
        ids.add(engine.start(MACHINE, {"n": n}, debounce_key="doc", debounce=30,
                             max_wait=45))
        vc.advance(10)
    [iid] = ids
    rec = engine.store.get(iid)
    assert (rec.status, rec.input["n"]) == ("scheduled", 3)
    assert rec.next_attempt_at == first_at + 45  # pushed back, but never past the max wait
    done = vc.run(engine.run(iid))
    assert (done.status, done.context["total"]) == ("completed", 3)
    assert engine.store.history(iid)[0].at >= first_at + 45
    later = engine.start(MACHINE, {"n": 4}, debounce_key="doc", debounce=30)
    assert later != iid  # the burst ran: a new one begins
    assert [r.id for r in engine.store.list()] == [iid, later]


@pytest.mark.slow
def test_concurrent_debounced_starts_from_8_processes_make_one_instance(store_url: str) -> None:
    ids = race(store_url, "debounce", 8)
    store = open_store(store_url)
    try:
        [rec] = store.list()
    finally:
        store.close()
    assert set(ids) == {rec.id} and rec.status == "scheduled"
    assert 0 <= rec.input["n"] < 8 and rec.debounce_key == "doc"


# -- priority ------------------------------------------------------------------------------
def test_claims_take_higher_priority_first_then_age(store_url: str) -> None:
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    old = engine.start(MACHINE, {"n": 1})
    vc.advance(10)
    low = engine.start(MACHINE, {"n": 2}, priority=-1)
    vc.advance(10)
    high = engine.start(MACHINE, {"n": 3}, priority=1)
    vc.advance(10)
    plain = engine.start(MACHINE, {"n": 4})
    engine.close()
    engine = _vc_engine(vc, store_url)
    # ranks: high 20 - 60, old 0, plain 30, low 10 + 60
    order = [r.id for r in vc.run(engine.resume(chunk=1))]
    assert order == [high, old, plain, low]


def test_aging_bounds_how_long_a_priority_overtakes(store_url: str) -> None:
    """An instance of priority 0 is overtaken by a priority 1 one started less than
    ``AGING_S`` after it, never by one started later than that."""
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    waiting = engine.start(MACHINE, {"n": 1})
    vc.advance(AGING_S - 1)
    soon = engine.start(MACHINE, {"n": 2}, priority=1)
    vc.advance(2)
    late = engine.start(MACHINE, {"n": 3}, priority=1)
    engine.close()
    engine = _vc_engine(vc, store_url)
    assert [r.id for r in vc.run(engine.resume(chunk=1))] == [soon, waiting, late]


def test_fan_out_children_and_forks_keep_their_parents_priority(tmp_path: Path) -> None:
    import asyncio

    from parallel_machines import fan

    from fsm_engine import Engine
    engine = Engine(str(tmp_path / "fsm.db"))
    try:
        iid = engine.start(fan, {"words": ["a", "b"]}, priority=3)
        assert asyncio.run(engine.run(iid)).status == "completed"
        kids = engine.store.children(iid)
        assert [k.priority for k in kids] == [3, 3]
        assert all(k.rank == pytest.approx(k.created_at - 3 * AGING_S) for k in kids)
        assert engine.store.get(engine.fork(iid, from_state="map")).priority == 3
    finally:
        engine.close()


def test_an_unpaused_delayed_start_is_scheduled_again_with_the_time_it_had_left(
        store_url: str) -> None:
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    iid = engine.start(MACHINE, {"n": 1}, delay=100)
    vc.advance(40)
    assert engine.pause(iid, by="ann").status == "paused"
    vc.advance(500)
    assert vc.run(engine.resume()) == []
    back = engine.unpause(iid, by="ann")
    assert (back.status, back.next_attempt_at) == ("scheduled", vc.now() + 60)
    assert vc.run(engine.resume()) == []  # (it came back running and ran at once)
    vc.advance(60)
    assert [r.status for r in vc.run(engine.resume())] == ["completed"]


def test_unpausing_a_debounced_start_whose_key_has_a_newer_burst_is_refused(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A paused debounced start is out of its burst (only a ``scheduled`` one folds starts
    in), so a start with its key opens a newer one; unpausing the first would make two
    bursts of one key: refused in one line naming the newer, nothing written — from Python
    and ``fsm unpause`` alike; once the newer one ran, the first unpauses."""
    from cli import run_main

    from fsm_engine.errors import FsmError
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    first = engine.start(MACHINE, {"n": 1}, debounce_key="doc", debounce=30)
    engine.pause(first, by="ann")
    newer = engine.start(MACHINE, {"n": 2}, debounce_key="doc", debounce=30)
    assert newer != first
    before = (engine.store.get(first), engine.store.history(first))
    with pytest.raises(FsmError) as err:
        engine.unpause(first, by="ann")
    text = str(err.value)
    assert newer in text and "debounce key 'doc'" in text and "\n" not in text
    code, out, errs = run_main(["unpause", first, "--db", store_url, "--yes"], capsys)
    assert code != 0 and newer in errs and "Traceback" not in errs, (out, errs)
    assert len(errs.strip().splitlines()) == 1, errs
    code, out, errs = run_main(["unpause", "--status", "paused", "--db", store_url, "--yes"],
                               capsys)  # by query: counted as an error, not as skipped
    assert "0 changed, 0 skipped" in out and newer in errs and "Traceback" not in errs
    assert code == 1  # a refusal by query fails the command (a script sees it)
    assert (engine.store.get(first), engine.store.history(first)) == before
    vc.advance(31)
    assert vc.run(engine.run(newer)).status == "completed"
    assert engine.unpause(first, by="ann").status == "scheduled"


def test_a_restarted_cancelled_delayed_start_keeps_its_due_time_while_it_is_ahead(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``fsm restart`` resumes a cancelled instance where it stopped: a delayed start
    cancelled before its time comes back ``scheduled`` for that time (nothing runs before
    it), once it has passed it starts at once; a debounced one whose key has a newer burst
    is refused in one line."""
    from cli import run_main

    from fsm_engine.errors import DebounceKeyTaken
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    due = vc.now() + 100
    iid = engine.start(MACHINE, {"n": 1}, delay=100)
    vc.advance(40)
    engine.cancel(iid)
    back = engine.restart(iid, by="ann")
    assert (back.status, back.owner, back.next_attempt_at) == ("scheduled", None, due)
    assert engine.store.history(iid)[-1].detail["scheduled_due"] == due
    assert vc.run(engine.resume()) == []  # not before its time
    vc.advance(60)
    [done] = vc.run(engine.resume())
    assert (done.id, done.status, done.context["total"]) == (iid, "completed", 1)
    late = engine.start(MACHINE, {"n": 2}, delay=100)
    engine.cancel(late)
    vc.advance(200)  # its time passed while it was cancelled: it starts now
    code, out, errs = run_main(["restart", late, "--db", store_url], capsys)
    assert code == 0 and "restarted, running" in out, (out, errs)
    rec = engine.store.get(late)
    assert (rec.status, rec.next_attempt_at) == ("running", None)
    assert [r.status for r in vc.run(engine.resume())] == ["completed"]
    first = engine.start(MACHINE, {"n": 3}, debounce_key="doc", debounce=30)
    engine.cancel(first)
    newer = engine.start(MACHINE, {"n": 4}, debounce_key="doc", debounce=30)
    before = engine.store.get(first)
    with pytest.raises(DebounceKeyTaken) as err:
        engine.restart(first, by="ann")
    assert newer in str(err.value) and engine.store.get(first) == before


def test_a_paused_then_cancelled_delayed_start_restarts_scheduled_for_its_due_time(
        store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A delayed start paused and then cancelled keeps its due time for a restart
    (``detail.scheduled_due`` on its cancel row, taken from its pause row), as one
    cancelled unpaused does: ``scheduled`` again for the time it was due while that is
    ahead, started at once once it has passed; cancelled by query (``fsm cancel --status``)
    too."""
    from cli import run_main
    vc = VirtualClock()
    engine = _vc_engine(vc, store_url)
    due = vc.now() + 3600
    iid = engine.start(MACHINE, {"n": 1}, delay=3600)
    vc.advance(40)
    assert engine.pause(iid, by="ann").status == "paused"
    vc.advance(60)
    engine.cancel(iid)
    assert engine.store.history(iid)[-1].detail["scheduled_due"] == due
    back = engine.restart(iid, by="ann")
    assert (back.status, back.owner, back.next_attempt_at) == ("scheduled", None, due)
    assert vc.run(engine.resume()) == []  # not before its time
    vc.advance(3500)
    [done] = vc.run(engine.resume())
    assert (done.id, done.status, done.context["total"]) == (iid, "completed", 1)
    late = engine.start(MACHINE, {"n": 2}, delay=100)
    engine.pause(late, by="ann")
    code, out, errs = run_main(["cancel", "--status", "paused", "--db", store_url, "--yes"],
                               capsys)
    assert code == 0 and "1 changed" in out, (out, errs)
    assert engine.store.history(late)[-1].detail["scheduled_due"] == vc.now() + 100
    vc.advance(200)  # its time passed while it was cancelled: it starts now
    rec = engine.restart(late, by="ann")
    assert (rec.status, rec.next_attempt_at) == ("running", None)
    assert [r.status for r in vc.run(engine.resume())] == ["completed"]
