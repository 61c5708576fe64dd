"""Contract cases for group commits as a worker makes them: many owned instances, one
step each, in one ``Store.commit``.

This is the batch PostgreSQL writes as one statement (``store/pg_commit.py``); the
cases hold on every backend: each step applies or not by its version alone, with
exactly its own history, attempt, outbox and large-value rows; a column a step sets
to NULL becomes NULL, one it leaves alone keeps its value; a refused step is named by
its index with nothing of the batch written.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..errors import StepRejected
from ..store import StepCommit, Store
from ..store.codec import CONTEXT_THRESHOLD
from .contract_fixtures import attempt, hist, live, moved, record

#: A history delta value above the large-value threshold (text a JSON encoder escapes).
BIG = "a \"big\" value ☃\n" * (CONTEXT_THRESHOLD // 8)


def owned(store: Store, *ids: str) -> None:
    """Instances ``ids``, running under worker ``w1`` (as claimed)."""
    live(store, "w1")
    store.create(*(record(i, status="running", owner="w1") for i in ids))


class BatchContract:
    """Group commits of many owned instances."""

    def test_a_batch_applies_each_fresh_step_with_its_own_rows(self, store: Store) -> None:
        owned(store, "a", "b", "c", "d")
        for i in "ac":
            store.outbox_begin(f"{i}:start:1", i, "start", 1, 1000.5)
        recs = {i: store.get(i) for i in "abcd"}
        steps = [StepCommit(moved(recs[i], "x", tokens=3), 9 if i == "b" else 0,
                            history=[hist(i, 1, "start", "x", delta={"who": i})],
                            attempt=attempt(i) if i in "ab" else None,
                            outbox_done=(f"{i}:start:1", {"ok": i}) if i in "ac" else None,
                            before=recs[i])
                 for i in "abcd"]
        assert store.commit(steps) == [True, False, True, True]
        assert [store.get(i).state for i in "abcd"] == ["x", "start", "x", "x"]
        assert [store.get(i).version for i in "abcd"] == [1, 0, 1, 1]
        assert [s.record.version for s in steps] == [1, 0, 1, 1]
        assert [[h.delta for h in store.history(i)] for i in "abcd"] == \
            [[{"who": "a"}], [], [{"who": "c"}], [{"who": "d"}]]
        assert [len(store.attempts(i)) for i in "abcd"] == [1, 0, 0, 0]
        assert [(b.instance_id, b.status, b.result) for b in store.outbox()] == \
            [("a", "done", {"ok": "a"}), ("c", "done", {"ok": "c"})]

    def test_a_column_set_to_null_is_null_and_one_left_alone_keeps_its_value(
            self, store: Store) -> None:
        owned(store, "a", "b")
        first = [StepCommit(moved(store.get(i), "x", reason="r", last_error="e",
                                  next_attempt_at=5.0), 0, before=store.get(i))
                 for i in "ab"]
        assert store.commit(first) == [True, True]
        a, b = store.get("a"), store.get("b")
        steps = [StepCommit(moved(a, "y", reason=None, next_attempt_at=None), 1, before=a),
                 StepCommit(moved(b, "y"), 1, before=b)]
        assert store.commit(steps) == [True, True]
        assert [(r.reason, r.last_error, r.next_attempt_at, r.owner) for r in
                (store.get("a"), store.get("b"))] == [(None, "e", None, "w1"),
                                                      ("r", "e", 5.0, "w1")]

    def test_large_history_values_read_back_whole(self, store: Store) -> None:
        owned(store, "a", "b")
        steps = []
        for i in "ab":
            rec = store.get(i)
            new = moved(rec, "x", context={**rec.context, "doc": BIG})
            steps.append(StepCommit(new, 0, before=rec, history=[
                hist(i, 1, "start", "x", delta={"doc": BIG, "n": 1})]))
        assert store.commit(steps) == [True, True]
        for i in "ab":
            [row] = store.history(i)
            assert row.delta == {"doc": BIG, "n": 1}
            assert store.get(i).context["doc"] == BIG

    def test_a_batch_with_a_constraint_violation_names_the_step(self, store: Store) -> None:
        owned(store, "a", "b", "c")
        a = store.get("a")
        assert store.commit([StepCommit(moved(a, "x"), 0, before=a,
                                        history=[hist("a", 1, "start", "x")])]) == [True]
        fine = [StepCommit(moved(store.get(i), "x"), 0, history=[hist(i, 1, "start", "x")])
                for i in "bc"]
        a = store.get("a")
        dup = StepCommit(replace(moved(a, "y"), seq=1), 1, history=[hist("a", 1, "x", "y")])
        with pytest.raises(StepRejected) as err:
            store.commit([fine[0], dup, fine[1]])
        assert (err.value.index, err.value.instance_id) == (1, "a")
        assert [store.get(i).state for i in "abc"] == ["x", "start", "start"]
        assert store.commit(fine) == [True, True]
        assert [len(store.history(i)) for i in "abc"] == [1, 1, 1]
