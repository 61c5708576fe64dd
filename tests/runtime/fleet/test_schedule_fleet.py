"""Real ``fsm worker`` processes firing one schedule (issue 38, item 2): each tick makes
exactly one instance across the fleet — three workers at once, a worker SIGKILLed between
a tick's start and its advance, a PostgreSQL restart mid-run.  The books: the ids of the
schedule's instances equal the ids of its ticks from the first to the last fired, one each
(``catchup=all``, ``overlap=allow``: no tick may be dropped or skipped)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from procs import wait_until
from tick_fleet import Workers, add, books

from fsm_engine import open_store
from fsm_engine.errors import StoreError
from fsm_engine.runtime.schedule_spec import tick_id


@pytest.fixture
def workers(tmp_path: Path):  # noqa: ANN201
    made: list[Workers] = []

    def make(url: str) -> Workers:
        made.append(Workers(url, tmp_path))
        return made[-1]
    yield make
    for w in made:
        w.stop()


def _fired_past(store, name: str, t: float) -> bool:  # noqa: ANN001
    try:
        row = store.get_schedule(name)
    except StoreError:  # (the probe's own connection, through a restart)
        return False
    return row is not None and row.last_fire is not None and row.last_fire >= t


@pytest.mark.slow
def test_three_workers_on_one_schedule_start_one_instance_per_tick(tmp_path, workers) -> None:
    url = str(tmp_path / "fsm.db")
    first = add(url, "beat").next_fire
    fleet = workers(url)
    fleet.spawn(3)
    store = open_store(url)
    try:
        wait_until(lambda: _fired_past(store, "beat", first + 10), 60, "ten seconds of ticks")
        assert fleet.stop() == [0, 0, 0], [fleet.log(i)[-2000:] for i in range(3)]
        have, ticks = books(store, "beat", first)
        assert len(ticks) >= 11 and have == ticks  # every tick once, none twice
        assert store.get_schedule("beat").missed == 0
    finally:
        store.close()
    for i in range(3):
        assert "Traceback" not in fleet.log(i)


@pytest.mark.slow
def test_a_worker_killed_between_a_ticks_start_and_its_advance(tmp_path, workers) -> None:
    url = str(tmp_path / "fsm.db")
    first = add(url, "beat").next_fire
    fleet = workers(url)
    fleet.spawn(1, env={"FSM_CRASH_AT": "create:after:1:start"})  # SIGKILL once started
    assert fleet.procs[0].wait(timeout=60) == -signal.SIGKILL, fleet.log(0)
    store = open_store(url)
    try:
        row = store.get_schedule("beat")
        cut = tick_id("beat", first)
        assert [r.id for r in store.list()] == [cut]  # the tick's instance was started ...
        assert (row.next_fire, row.last_instance) == (first, None)  # ... and not advanced
        fleet.spawn(2)
        wait_until(lambda: _fired_past(store, "beat", first + 3), 60, "ticks after the cut")
        wait_until(lambda: store.get(cut).status == "completed", 60, "the cut tick's instance")
        assert fleet.stop()[1:] == [0, 0]
        have, ticks = books(store, "beat", first)
        assert ticks[0] == cut and have == ticks
    finally:
        store.close()


@pytest.mark.slow
def test_ticks_go_on_once_each_through_a_postgres_restart(pg_cluster, workers) -> None:
    url = pg_cluster.database()
    first = add(url, "beat").next_fire
    fleet = workers(url)
    fleet.spawn(3)
    store = open_store(url)
    try:
        wait_until(lambda: _fired_past(store, "beat", first + 3), 60, "ticks before")
        pg_cluster.restart()
        after = time.time()
        wait_until(lambda: _fired_past(store, "beat", after + 3), 60, "ticks after the restart")
        assert fleet.stop() == [0, 0, 0], [fleet.log(i)[-2000:] for i in range(3)]
        have, ticks = books(store, "beat", first)
        assert have == ticks and store.get_schedule("beat").missed == 0
    finally:
        store.close()
    said = [fleet.log(i) for i in range(3)]  # they did see it go away (at a claim, or a tick)
    assert any("store unavailable" in s or "schedules not fired" in s for s in said), said
