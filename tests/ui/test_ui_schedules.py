"""The viewer's schedules page and a tick instance's page (issue 38, item 8), in-process over
a read-only store; a schedule's stored text is escaped."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("starlette")
import tick_machine  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from fsm_engine import Engine, SqliteStore  # noqa: E402
from fsm_engine.runtime.schedule_spec import tick_id  # noqa: E402
from fsm_engine.ui import create_app  # noqa: E402

T0 = 1_700_000_000.0


def test_schedules_and_tick_instances_are_shown(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    engine = Engine(db, clock=lambda: T0)
    try:
        engine.schedules.add("beat", tick_machine.machine, every="2s",
                             input={"label": "<script>x</script>"})
        engine.schedules.add("night", tick_machine.machine, cron="0 3 * * *",
                             tz="Europe/Paris", paused=True)
        [fired] = engine.schedules.backfill("beat", T0 - 1, T0)
    finally:
        engine.close()
    store = SqliteStore(db, readonly=True)
    try:
        client = TestClient(create_app(store))
        page = client.get("/schedules")
        assert page.status_code == 200
        text = page.text
        assert '<tr data-name="beat">' in text and '<tr data-name="night">' in text
        assert "every 2s" in text and "cron 0 3 * * *" in text and "Europe/Paris" in text
        assert "paused" in text and 'href="/schedules"' in client.get("/").text  # in the nav
        assert fired.instance_id == tick_id("beat", T0 - 1)
        instance = client.get(f"/instances/{fired.instance_id}").text
        assert 'id="schedule-tick"' in instance and ">beat</a> for its tick" in instance
        assert "<script>x</script>" not in instance  # the stored input, escaped
        other = client.get("/").text
        assert 'id="schedule-tick"' not in other
    finally:
        store.close()


def test_no_schedule_is_an_empty_page(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    Engine(db).close()
    store = SqliteStore(db, readonly=True)
    try:
        text = TestClient(create_app(store)).get("/schedules").text
        assert "No schedule" in text
    finally:
        store.close()
