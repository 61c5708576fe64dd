"""Contract cases for circuit breakers shared through the store (mixed into
``StoreContract``): one row per name, written by compare-and-set on its version.
"""

from __future__ import annotations

from dataclasses import replace

from ..store import BreakerRow, Store


class BreakerContract:
    """``get_breaker`` / ``put_breaker``: closed by default, compare-and-set, one per name."""

    def test_breaker_default_is_closed_and_empty(self, store: Store) -> None:
        row = store.get_breaker("openai:gpt")
        assert row == BreakerRow("openai:gpt")
        assert (row.state, row.events, row.opened_at, row.probe_at, row.version) == \
            ("closed", [], None, None, 0)

    def test_breaker_put_is_compare_and_set(self, store: Store) -> None:
        mine = BreakerRow("p:m", state="open", events=[[1.0, False], [2.0, True]], opened_at=2.0)
        theirs = BreakerRow("p:m", state="closed", events=[[1.5, True]])
        assert store.put_breaker(mine, 0) is True
        assert mine.version == 1
        assert store.put_breaker(theirs, 0) is False  # created by someone else first
        assert store.get_breaker("p:m") == mine
        mine.state, mine.probe_at = "half_open", 5.0
        assert store.put_breaker(mine, 1) is True
        assert store.get_breaker("p:m").version == 2
        assert store.put_breaker(replace(theirs, version=1), 1) is False  # old version
        got = store.get_breaker("p:m")
        assert (got.state, got.probe_at, got.events) == ("half_open", 5.0, [[1.0, False], [2.0, True]])

    def test_breakers_are_independent_by_name(self, store: Store) -> None:
        assert store.put_breaker(BreakerRow("a", state="open"), 0)
        assert store.get_breaker("b").state == "closed"
