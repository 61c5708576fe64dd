"""Contract cases for the outbox (mixed into ``StoreContract``): side-effect keys begun,
counted per attempt, and done with the step that records their result.
"""

from __future__ import annotations

from ..store import OutboxBegin, StepCommit, Store
from .contract_fixtures import moved, record


class OutboxContract:
    """``outbox_begin`` / ``outbox_begins`` count attempts until a commit marks a key done."""

    def test_outbox_begin_inserts_then_counts_attempts(self, store: Store) -> None:
        store.create(record("a"))
        first = store.outbox_begin("a:notify:1", "a", "notify", 1, 10.0)
        assert (first.key, first.instance_id, first.state, first.visit, first.status,
                first.attempts, first.created_at, first.updated_at, first.result) == \
            ("a:notify:1", "a", "notify", 1, "pending", 1, 10.0, 10.0, None)
        second = store.outbox_begin("a:notify:1", "a", "notify", 1, 20.0)
        assert (second.attempts, second.created_at, second.updated_at) == (2, 10.0, 20.0)
        assert len(store.outbox()) == 1

    def test_outbox_done_via_commit_stops_counting(self, store: Store) -> None:
        store.create(record("a"))
        store.create(record("b"))
        store.outbox_begin("a:notify:1", "a", "notify", 1, 10.0)
        store.outbox_begin("b:notify:1", "b", "notify", 1, 11.0)
        step = StepCommit(moved(store.get("a"), "done", status="completed"), 0,
                          outbox_done=("a:notify:1", {"visit": 1, "ok": "✓"}))
        assert store.commit([step]) == [True]
        again = store.outbox_begin("a:notify:1", "a", "notify", 1, 30.0)
        assert (again.status, again.attempts, again.result) == ("done", 1, {"visit": 1, "ok": "✓"})
        assert [r.key for r in store.outbox()] == ["a:notify:1", "b:notify:1"]
        assert [r.status for r in store.outbox("b")] == ["pending"]
        assert store.outbox("nobody") == []

    def test_outbox_begins_in_order_in_one_batch(self, store: Store) -> None:
        store.create(record("a"))
        store.create(record("b"))
        store.outbox_begin("a:notify:1", "a", "notify", 1, 10.0)
        step = StepCommit(moved(store.get("a"), "done", status="completed"), 0,
                          outbox_done=("a:notify:1", {"visit": 1}))
        assert store.commit([step]) == [True]
        rows = store.outbox_begins([OutboxBegin("b:notify:1", "b", "notify", 1, 20.0),
                                    OutboxBegin("a:notify:1", "a", "notify", 1, 21.0),
                                    OutboxBegin("b:notify:1", "b", "notify", 1, 22.0)])
        assert [(r.key, r.status, r.attempts) for r in rows] == [
            ("b:notify:1", "pending", 1),  # new
            ("a:notify:1", "done", 1),  # done: left as it was
            ("b:notify:1", "pending", 2)]  # the same key twice counts twice
        assert (rows[0].updated_at, rows[2].updated_at, rows[2].created_at) == (20.0, 22.0, 20.0)
        assert store.outbox_begins([]) == []
        assert [r.attempts for r in store.outbox("b")] == [2]
