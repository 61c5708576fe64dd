"""Contract cases for stored schedules (format 15, ``store.schedules``; mixed into
``StoreContract``): names are unique, due rows come earliest first, and every change is a
compare-and-set on the row's version, also among concurrent writers."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..store import Store
from ..store.schedules import ScheduleRow
from .contract_fixtures import UNICODE, concurrently


def schedule(name: str, *, next_fire: float = 100.0, paused: bool = False,
             cron: str | None = None) -> ScheduleRow:
    """A new schedule row as ``Engine.schedules.add`` would write it (every 10 s unless
    ``cron``)."""
    return ScheduleRow(name=name, module="/x/m.py", machine="m", cron=cron,
                       every_s=None if cron else 10.0, tz="Europe/Paris", input=dict(UNICODE),
                       overlap="skip", catchup="none", paused=paused, anchor=90.0,
                       next_fire=next_fire, created_at=90.0)


class ScheduleContract:
    """``add_schedule`` / ``get_schedule`` / ``schedules`` / ``due_schedules`` /
    ``next_schedule_fire`` / ``update_schedule`` / ``delete_schedule`` on every backend."""

    def test_schedules_round_trip_and_names_are_unique(self, store: Store) -> None:
        assert store.get_schedule("a") is None and store.schedules() == []
        a, b = schedule("a"), schedule("b", cron="*/5 0 6 * * *")
        assert store.add_schedule(b) and store.add_schedule(a)
        assert store.add_schedule(replace(a, module="/other.py")) is False
        assert store.get_schedule("a") == a and store.get_schedule("b") == b
        assert [r.name for r in store.schedules()] == ["a", "b"]
        assert store.get_schedule("a").input == UNICODE  # type: ignore[union-attr]

    def test_due_schedules_are_the_unpaused_ones_due_earliest_first(self, store: Store) -> None:
        for row in (schedule("late", next_fire=300.0), schedule("soon", next_fire=200.0),
                    schedule("first", next_fire=150.0), schedule("held", next_fire=10.0,
                                                                 paused=True)):
            store.add_schedule(row)
        assert [r.name for r in store.due_schedules(250.0, 10)] == ["first", "soon"]
        assert [r.name for r in store.due_schedules(250.0, 1)] == ["first"]
        assert store.due_schedules(100.0, 10) == []
        assert store.next_schedule_fire() == 150.0

    def test_no_unpaused_schedule_has_no_next_fire(self, store: Store) -> None:
        assert store.next_schedule_fire() is None
        store.add_schedule(schedule("held", paused=True))
        assert store.next_schedule_fire() is None

    def test_a_schedule_update_applies_only_at_the_version_read(self, store: Store) -> None:
        store.add_schedule(schedule("a"))
        row = store.get_schedule("a")
        assert row is not None and row.version == 1
        moved = replace(row, next_fire=110.0, last_fire=100.0, last_instance="a-1", skipped=2)
        assert store.update_schedule(moved, 1) and moved.version == 2
        assert store.get_schedule("a") == moved
        stale = replace(row, next_fire=999.0)
        assert store.update_schedule(stale, 1) is False and stale.version == 1
        assert store.get_schedule("a") == moved
        assert store.update_schedule(schedule("gone"), 1) is False

    def test_schedule_updates_in_one_transaction_apply_each_at_its_version(
            self, store: Store) -> None:
        for name in ("a", "b", "c"):
            store.add_schedule(schedule(name))
        a, b, c = (schedule(n, next_fire=500.0) for n in "abc")
        assert store.update_schedules([(a, 1), (b, 7), (c, 1)]) == [True, False, True]
        assert (a.version, b.version, c.version) == (2, 1, 2)
        assert [(r.name, r.next_fire, r.version) for r in store.schedules()] == [
            ("a", 500.0, 2), ("b", 100.0, 1), ("c", 500.0, 2)]
        assert store.update_schedules([]) == []

    def test_one_of_concurrent_schedule_updates_wins(self, store: Store, reopen: Any) -> None:
        store.add_schedule(schedule("a"))
        won: list[int] = []

        def advance(n: int, s: Store) -> None:
            row = schedule("a", next_fire=1000.0 + n)
            if s.update_schedule(row, 1):
                won.append(n)
        concurrently(advance, store, [reopen() for _ in range(3)])
        assert len(won) == 1
        got = store.get_schedule("a")
        assert got is not None and (got.next_fire, got.version) == (1000.0 + won[0], 2)

    def test_delete_removes_only_that_schedule(self, store: Store) -> None:
        store.add_schedule(schedule("a"))
        store.add_schedule(schedule("b"))
        assert store.delete_schedule("a") and store.delete_schedule("a") is False
        assert [r.name for r in store.schedules()] == ["b"]
