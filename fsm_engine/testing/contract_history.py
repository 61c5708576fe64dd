"""Contract cases for history rows (mixed into ``StoreContract``): ordered by ``seq``,
every field round-trips, a migration's row carries its machine version.
"""

from __future__ import annotations

from dataclasses import replace

from ..store import HistoryRow, StepCommit, Store
from .contract_fixtures import hist, moved, record


class HistoryContract:
    """``history(iid)``: the rows a step committed, in ``seq`` order, exactly as written."""

    def test_history_is_ordered_by_seq(self, store: Store) -> None:
        store.create(record("a"))
        rec = store.get("a")
        rows = [hist("a", 2, "b", "c"), hist("a", 1, "start", "b"), hist("a", 3, "c", "d")]
        assert store.commit([StepCommit(moved(rec, "d"), 0, history=rows)]) == [True]
        rec = store.get("a")
        store.commit([StepCommit(moved(rec, "e"), 1, history=[hist("a", 4, "d", "e")])])
        assert [h.seq for h in store.history("a")] == [1, 2, 3, 4]

    def test_history_row_fields_round_trip(self, store: Store) -> None:
        store.create(record("a"))
        row = HistoryRow(instance_id="a", seq=1, source="start", dest="x", trigger="fallback",
                         at=1234.5, kind="fallback", guards=[["is_ready", True], ["cheap", False]],
                         duration_ms=12.25, tokens=9, error="ServerError: 502", reason="timeout",
                         delta={"s": "z"}, detail={"llm_calls": [{"tokens": 9}]})
        store.commit([StepCommit(moved(store.get("a"), "x"), 0, history=[row])])
        assert store.history("a") == [row]

    def test_a_migration_moves_version_and_fingerprint_with_its_row(self, store: Store) -> None:
        store.create(record("a"))
        old = store.get("a")
        assert old.machine_version == 1
        store.commit([StepCommit(moved(old, "b"), 0, history=[hist("a", 1, "start", "b")])])
        v1 = store.get("a")
        up = replace(moved(v1, "c"), machine_version=2, fingerprint="fedcba9876543210",
                     context={"n": 0, "s": "x", "lang": "en"})
        row = hist("a", 2, "b", "c", kind="migration", machine_version=2,
                   delta={"lang": "en"}, detail={"from_version": 1, "to_version": 2})
        stale = StepCommit(replace(up), v1.version - 1, history=[row], before=v1)
        assert store.commit([stale]) == [False] and store.get("a") == v1
        assert store.commit([StepCommit(up, v1.version, history=[row], before=v1)]) == [True]
        got = store.get("a")
        assert (got.machine_version, got.fingerprint, got.state, got.context["lang"]) == (
            2, "fedcba9876543210", "c", "en")
        assert [h.machine_version for h in store.history("a")] == [1, 2]
        assert store.history("a")[1] == row
