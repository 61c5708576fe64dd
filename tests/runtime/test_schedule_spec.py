"""The tick arithmetic of schedules (``runtime.schedule_spec``): intervals, cron with an
optional seconds field across a daylight-saving change, ids, times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fsm_engine.errors import InvalidInput
from fsm_engine.runtime import schedule_spec as spec
from fsm_engine.store.schedules import ScheduleRow


def row(*, cron: str | None = None, every_s: float | None = None, tz: str = "UTC",
        anchor: float = 0.0) -> ScheduleRow:
    return ScheduleRow("s", "m.py", "m", cron, every_s, tz, {}, "skip", "none", False,
                       anchor, 0.0)


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(("text", "seconds"), [
    ("2s", 2.0), ("500ms", 0.5), ("10m", 600.0), ("1h30m", 5400.0), ("1d", 86400.0),
    (" 2S ", 2.0), ("1h 30m", 5400.0), ("2w", 1209600.0), (3, 3.0), (0.25, 0.25)])
def test_intervals_read_as_seconds(text: str | float, seconds: float) -> None:
    assert spec.parse_every(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "2x", "s", "1h30", "-1s", "0s", "400d",
                                  float("nan"), True])
def test_bad_intervals_are_refused(text: object) -> None:
    with pytest.raises(InvalidInput, match="--every"):
        spec.parse_every(text)  # type: ignore[arg-type]


def test_interval_ticks_fall_on_the_anchor_grid() -> None:
    r = row(every_s=2.5, anchor=100.0)
    assert spec.next_after(r, 100.0) == 102.5 and spec.next_after(r, 101.0) == 102.5
    assert spec.next_after(r, 94.0) == 95.0  # before the anchor too (a backfill's range)
    assert spec.ticks(r, 100.0, 110.0, 10) == [100.0, 102.5, 105.0, 107.5, 110.0]
    assert spec.ticks(r, 100.0, 110.0, 2) == [107.5, 110.0]  # the newest
    assert spec.count_older(r, 100.0, 107.5) == 3 and spec.count_older(r, 5.0, 5.0) == 0


def test_cron_reads_an_optional_seconds_field_first() -> None:
    five, six = row(cron="*/15 * * * *"), row(cron="30 */15 * * * *")
    t = at("2026-12-07T06:07:00+00:00")
    assert spec.next_after(five, t) == at("2026-12-07T06:15:00+00:00")
    assert spec.next_after(six, t) == at("2026-12-07T06:15:30+00:00")
    assert spec.ticks(six, t, t + 1800, 5) == [at("2026-12-07T06:15:30+00:00"),
                                                at("2026-12-07T06:30:30+00:00")]


def test_a_cron_schedules_missed_ticks_are_counted_up_to_a_cap() -> None:
    every_second = row(cron="* * * * * *")
    t = at("2026-12-07T06:00:00+00:00")
    assert spec.count_older(every_second, t, t + 50) == 50
    assert spec.count_older(every_second, t, t + 86400) == spec.COUNT_CAP  # not a day's walk


def test_cron_ticks_in_its_zone_across_a_daylight_saving_change() -> None:
    daily = row(cron="0 9 * * *", tz="Europe/Paris")  # 09:00 wall clock, CET then CEST
    first = spec.next_after(daily, at("2026-03-28T12:00:00+00:00"))
    second = spec.next_after(daily, first)
    assert first == at("2026-03-29T07:00:00+00:00")  # 09:00 CEST (the change was at 02:00)
    assert spec.next_after(daily, at("2026-03-27T12:00:00+00:00")) == \
        at("2026-03-28T08:00:00+00:00")  # 09:00 CET
    assert second - first == 86400


@pytest.mark.parametrize(("expr", "message"), [
    ("* * * *", "expected 5 fields"), ("* * * * * * *", "expected 5 fields"),
    ("61 * * * *", "out of range"), ("a b c d e", "--cron")])
def test_bad_cron_expressions_are_refused_in_one_line(expr: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as err:
        spec.check_cron(expr)
    assert "\n" not in str(err.value)


def test_zones_names_and_ids() -> None:
    spec.zone("America/New_York")
    with pytest.raises(InvalidInput, match="unknown time zone"):
        spec.zone("../../etc/passwd")
    with pytest.raises(InvalidInput):
        spec.check_name("x" * 101)
    assert spec.tick_id("s", at("2026-12-07T06:00:00+00:00")) == "s-20261207T060000Z"
    assert spec.tick_id("s", at("2026-12-07T06:00:00+00:00") + 0.25) == \
        "s-20261207T060000.250Z"
    assert spec.parse_tick_id("a-b.c-20261207T060000.250Z") == (
        "a-b.c", at("2026-12-07T06:00:00+00:00") + 0.25)
    for other in ("20261207T060000Z", "s-20261307T060000Z", "s-20261207T060000", "x"):
        assert spec.parse_tick_id(other) is None
    assert spec.iso(0.0) == "1970-01-01T00:00:00.000Z" and spec.iso(None) is None
    assert spec.parse_time("2026-12-07T07:00", "Europe/Paris") == \
        datetime(2026, 12, 7, 6, tzinfo=UTC).timestamp()
    with pytest.raises(InvalidInput, match="ISO 8601"):
        spec.parse_time("yesterday")
