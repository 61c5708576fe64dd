"""Contract cases for instance records (mixed into ``StoreContract``): ``create``, ``get``
and ``list``; every field, keys handed out in order, non-ASCII JSON round-tripping.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..errors import InstanceNotFound, StoreError
from ..store import StepCommit, Store
from .contract_fixtures import UNICODE, hist, moved, record


class InstanceContract:
    """``create`` / ``get`` / ``list``: records round-trip exactly, ids are unique, keys increase."""

    def test_create_then_get_round_trips_every_field(self, store: Store) -> None:
        rec = record("a")
        rec.reason, rec.last_error, rec.deadline, rec.next_attempt_at = "r", "e", 2000.5, 1500.25
        store.create(rec)
        assert store.get("a") == rec
        assert store.get("a").version == 0

    def test_create_duplicate_id_fails_and_keeps_the_original(self, store: Store) -> None:
        store.create(record("a", machine="first"))
        late = [record("b"), record("a", machine="second")]
        with pytest.raises(StoreError):
            store.create(*late)
        assert store.get("a").machine == "first"
        assert [r.key for r in late] == [None, None]  # nothing stored, no key handed out
        with pytest.raises(InstanceNotFound):
            store.get("b")

    def test_create_hands_out_increasing_keys(self, store: Store) -> None:
        first, second = record("x"), record("y")
        store.create(first, second)
        third = record("a")
        store.create(third)
        assert first.key is not None and first.key < second.key < third.key  # type: ignore[operator]
        assert [store.get(i).key for i in ("x", "y", "a")] == [first.key, second.key, third.key]

    def test_commit_of_a_record_without_its_key_finds_it_by_id(self, store: Store) -> None:
        store.create(record("a"))
        base = replace(store.get("a"), key=None)  # e.g. built by hand from an export
        new = moved(base, "next")
        step = StepCommit(new, 0, [hist("a", 1, "start", "next")], before=base)
        assert store.commit([step]) == [True]
        assert new.key == store.get("a").key
        assert [h.dest for h in store.history("a")] == ["next"]

    def test_unknown_id_raises_instance_not_found(self, store: Store) -> None:
        store.create(record("a"))
        for call in (lambda: store.get("nope"), lambda: store.history("nope")):
            with pytest.raises(InstanceNotFound) as info:
                call()
            assert info.value.instance_id == "nope"
            assert "'nope'" in str(info.value)

    def test_list_is_oldest_first_and_filters(self, store: Store) -> None:
        store.create(record("c", machine="m1", status="pending"))
        store.create(record("a", machine="m2", status="running", owner="w1"))
        store.create(record("b", machine="m1", status="completed", owner="w1"))
        store.create(record("d", machine="m2", status="waiting", owner="w2"))
        ids = lambda **kw: [r.id for r in store.list(**kw)]  # noqa: E731
        assert ids() == ["c", "a", "b", "d"]
        assert ids(statuses=["running", "waiting"]) == ["a", "d"]
        assert ids(statuses=["failed"]) == []
        assert ids(machine="m1") == ["c", "b"]
        assert ids(owner="w1") == ["a", "b"]
        assert ids(machine="m2", owner="w1") == ["a"]
        assert ids(statuses=["completed"], machine="m1", owner="w1") == ["b"]
        assert ids(machine="m3") == []

    def test_list_on_empty_store(self, store: Store) -> None:
        assert store.list() == []

    def test_non_ascii_json_round_trips(self, store: Store) -> None:
        rec = record("ü-审核")
        rec.context, rec.input = dict(UNICODE), dict(UNICODE)
        rec.visits = {"État 1": 2, "审核 中": 1}
        store.create(rec)
        assert store.get("ü-审核") == rec
        row = hist("ü-审核", 1, "État 1", "审核 中", delta=dict(UNICODE), detail={"note": "日本"},
                   guards=[["prêt?", True]])
        store.outbox_begin("ü-审核:审核 中:1", "ü-审核", "审核 中", 1, 1.0)
        store.commit([StepCommit(moved(rec, "审核 中", context=dict(UNICODE)), 0, history=[row],
                                 outbox_done=("ü-审核:审核 中:1", dict(UNICODE)))])
        assert store.get("ü-审核").context == UNICODE
        assert store.history("ü-审核") == [row]
        assert store.outbox("ü-审核")[0].result == UNICODE
        assert [r.id for r in store.list(machine="m")] == ["ü-审核"]
