"""Contract cases for ``Store.commit`` (mixed into ``StoreContract``): a step applies its
instance row, history, attempt and outbox together or not at all, by version alone;
with ``before`` only the changed columns are written; a step the store cannot take is
refused by its index (``StepRejected``) with nothing of the batch written.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..errors import StepRejected, StoreError
from ..store import StepCommit, Store
from .contract_fixtures import attempt, hist, moved, record


class CommitContract:
    """One ``commit`` of many steps: each applies or not by its expected version."""

    def test_commit_applies_instance_history_attempt_and_outbox_together(self, store: Store) -> None:
        store.create(record("a"))
        store.outbox_begin("a:start:1", "a", "start", 1, 1000.5)
        new = moved(store.get("a"), "middle", tokens=42, context={"n": 1, "s": "y"})
        step = StepCommit(new, expected_version=0,
                          history=[hist("a", 1, "start", "middle", tokens=42, delta={"n": 1})],
                          attempt=attempt("a"), outbox_done=("a:start:1", {"visit": 1}))
        assert store.commit([step]) == [True]
        got = store.get("a")
        assert (got.state, got.status, got.seq, got.tokens_used, got.version) == \
            ("middle", "running", 1, 42, 1)
        assert got.context == {"n": 1, "s": "y"}
        assert new.version == 1  # the caller's record learns its new version
        assert [(h.seq, h.source, h.dest, h.tokens, h.delta) for h in store.history("a")] == \
            [(1, "start", "middle", 42, {"n": 1})]
        assert store.attempts("a") == [attempt("a")]
        [box] = store.outbox("a")
        assert (box.status, box.result, box.updated_at) == ("done", {"visit": 1}, new.updated_at)

    def test_commit_with_stale_version_applies_nothing(self, store: Store) -> None:
        store.create(record("a"))
        store.outbox_begin("a:start:1", "a", "start", 1, 1000.5)
        before = store.get("a")
        step = StepCommit(moved(before, "middle"), expected_version=3,
                          history=[hist("a", 1, "start", "middle")], attempt=attempt("a"),
                          outbox_done=("a:start:1", {"visit": 1}))
        assert store.commit([step]) == [False]
        assert store.get("a") == before
        assert store.history("a") == []
        assert store.attempts("a") == []
        assert store.outbox("a")[0].status == "pending"

    def test_batch_applies_only_the_fresh_step(self, store: Store) -> None:
        store.create(record("a"))
        store.create(record("b"))
        stale = StepCommit(moved(store.get("a"), "middle"), expected_version=7,
                           history=[hist("a", 1, "start", "middle")])
        fresh = StepCommit(moved(store.get("b"), "middle"), expected_version=0,
                           history=[hist("b", 1, "start", "middle")])
        assert store.commit([stale, fresh]) == [False, True]
        assert (store.get("a").state, store.get("a").version) == ("start", 0)
        assert (store.get("b").state, store.get("b").version) == ("middle", 1)
        assert store.history("a") == [] and len(store.history("b")) == 1

    def test_a_stale_step_amid_fresh_ones_fails_alone(self, store: Store) -> None:
        """Each step of a batch learns its own outcome, however the store groups their
        statements (SQLite writes like steps by one executemany, see ``sqlite_batch``)."""
        ids = [f"i{k}" for k in range(5)]
        store.create(*(record(i) for i in ids))
        steps = [StepCommit(moved(store.get(i), "middle"), expected_version=7 if i == "i2" else 0,
                            history=[hist(i, 1, "start", "middle")]) for i in ids]
        assert store.commit(steps) == [True, True, False, True, True]
        assert [s.record.version for s in steps] == [1, 1, 0, 1, 1]
        assert [store.get(i).state for i in ids] == ["middle"] * 2 + ["start"] + ["middle"] * 2
        assert [len(store.history(i)) for i in ids] == [1, 1, 0, 1, 1]

    def test_two_steps_from_the_same_version_only_the_first_applies(self, store: Store) -> None:
        store.create(record("a"))
        base = store.get("a")
        first = StepCommit(moved(base, "left"), 0, history=[hist("a", 1, "start", "left")])
        second = StepCommit(moved(base, "right"), 0, history=[hist("a", 1, "start", "right")])
        assert store.commit([first, second]) == [True, False]
        assert store.get("a").state == "left"
        assert [h.dest for h in store.history("a")] == ["left"]

    def test_commit_with_before_stores_the_new_record_exactly(self, store: Store) -> None:
        store.create(record("a", status="running", owner="w1"))
        base = store.get("a")
        new = moved(base, "middle", tokens=5, status="waiting", context={"n": 1, "s": "y"},
                    reason="r", last_error="e", attempt=2, next_attempt_at=5.5, deadline=9.0,
                    owner=None, recoveries=1, recovered_seq=0)
        assert store.commit([StepCommit(new, 0, [hist("a", 1, "start", "middle")],
                                        before=base)]) == [True]
        assert store.get("a") == new and new.version == 1
        again = replace(new, updated_at=new.updated_at + 1)  # one column changes
        assert store.commit([StepCommit(again, 1, before=new)]) == [True]
        assert store.get("a") == again and again.version == 2

    def test_commit_with_before_and_no_change_still_bumps_the_version(self, store: Store) -> None:
        store.create(record("a"))
        base = store.get("a")
        same = replace(base)
        assert store.commit([StepCommit(same, 0, before=base)]) == [True]
        assert store.get("a") == same and same.version == 1
        assert store.commit([StepCommit(replace(same), 0, before=same)]) == [False]

    def test_commit_with_before_and_stale_version_writes_nothing(self, store: Store) -> None:
        store.create(record("a"))
        base = store.get("a")
        step = StepCommit(moved(base, "middle", context={"n": 9}), 5,
                          history=[hist("a", 1, "start", "middle")], attempt=attempt("a"),
                          before=base)
        assert store.commit([step]) == [False]
        assert store.get("a") == base
        assert store.history("a") == [] and store.attempts("a") == []

    def test_commit_with_before_sharing_a_dict_edited_in_place(self, store: Store) -> None:
        store.create(record("a"))
        base = store.get("a")
        new = replace(base, seq=1)  # shares base.context and base.visits
        new.context["n"], new.visits["start"] = 7, 2
        assert store.commit([StepCommit(new, 0, before=base)]) == [True]
        got = store.get("a")
        assert (got.context, got.visits) == ({"n": 7, "s": "x"}, {"start": 2})

    def test_commit_with_before_keeps_a_value_whose_type_alone_changed(self, store: Store) -> None:
        rec = record("a")
        rec.context = {"flag": True, "n": 1}
        store.create(rec)
        base = store.get("a")
        new = replace(base, context={"flag": 1, "n": 1.0})  # == base.context, other JSON
        assert store.commit([StepCommit(new, 0, before=base)]) == [True]
        got = store.get("a").context
        assert type(got["flag"]) is int and type(got["n"]) is float

    def test_commit_without_before_writes_every_column(self, store: Store) -> None:
        store.create(record("a"))
        new = moved(store.get("a"), "end", tokens=3, status="completed", context={"done": True},
                    reason="ok", owner="w9", deadline=3.0)
        assert store.commit([StepCommit(new, 0, before=None)]) == [True]
        assert store.get("a") == new and new.version == 1

    def test_commit_of_nothing_is_a_no_op(self, store: Store) -> None:
        assert store.commit([]) == []

    def test_commit_chain_increments_version(self, store: Store) -> None:
        store.create(record("a"))
        rec = store.get("a")
        for seq, dest in enumerate(["b", "c", "d"], start=1):
            new = moved(rec, dest)
            assert store.commit([StepCommit(new, rec.version,
                                            history=[hist("a", seq, rec.state, dest)])]) == [True]
            rec = store.get("a")
            assert rec.version == seq == new.version
        assert store.commit([StepCommit(moved(rec, "e"), 2)]) == [False]

    def test_a_failing_step_rolls_back_its_instance_update(self, store: Store) -> None:
        store.create(record("a"))
        ok = StepCommit(moved(store.get("a"), "b"), 0, history=[hist("a", 1, "start", "b")])
        assert store.commit([ok]) == [True]
        dup = StepCommit(moved(store.get("a"), "c"), 1,
                         history=[hist("a", 1, "b", "c")], attempt=attempt("a"))  # seq 1 again
        with pytest.raises(StoreError):
            store.commit([dup])
        got = store.get("a")
        assert (got.state, got.version) == ("b", 1)
        assert [h.dest for h in store.history("a")] == ["b"]
        assert store.attempts("a") == []

    @pytest.mark.parametrize("bad", [float("nan"), float("inf"), b"\xff", object()],
                             ids=["nan", "inf", "bytes", "object"])
    def test_a_step_the_store_cannot_encode_is_rejected_by_index(self, store: Store,
                                                                bad: object) -> None:
        """``StepRejected`` names the step (``index``) and nothing of the batch is written,
        so the others can be committed again without it (the group committer does)."""
        store.create(record("a"), record("b"), record("c"))
        steps = [StepCommit(moved(store.get(i), "x"), 0, history=[
            hist(i, 1, "start", "x", detail={"v": bad if i == "b" else 1})]) for i in "abc"]
        with pytest.raises(StepRejected) as err:
            store.commit(steps)
        assert (err.value.index, err.value.instance_id) == (1, "b")
        assert "history[0].detail.v" in str(err.value)
        assert [store.get(i).state for i in "abc"] == ["start"] * 3
        assert store.commit([steps[0], steps[2]]) == [True, True]
        assert [store.get(i).state for i in "abc"] == ["x", "start", "x"]

    def test_a_constraint_violation_is_rejected_by_index(self, store: Store) -> None:
        store.create(record("a"), record("b"))
        assert store.commit([StepCommit(moved(store.get("a"), "b"), 0,
                                        history=[hist("a", 1, "start", "b")])]) == [True]
        fine = StepCommit(moved(store.get("b"), "x"), 0, history=[hist("b", 1, "start", "x")])
        dup = StepCommit(moved(store.get("a"), "c"), 1, history=[hist("a", 1, "b", "c")])
        with pytest.raises(StepRejected) as err:
            store.commit([fine, dup])
        assert err.value.index == 1 and store.get("b").state == "start"
        assert store.commit([fine]) == [True]

    def test_a_constraint_violation_in_a_large_batch_is_rejected_by_index(self,
                                                                          store: Store) -> None:
        """As above in a batch of 40 (PostgreSQL writes a batch's history rows by one
        ``COPY``): the refused step is named, nothing of the batch is written, and every
        row of the rest commits when sent again."""
        ids = [f"i{n:02}" for n in range(40)]
        store.create(*(record(i) for i in ids))
        first = store.get(ids[30])
        assert store.commit([StepCommit(moved(first, "b"), 0,
                                        history=[hist(ids[30], 1, "start", "b")])]) == [True]
        steps = [StepCommit(moved(store.get(i), "x"), store.get(i).version,
                            history=[hist(i, store.get(i).seq + 1, "start", "x"),
                                     hist(i, store.get(i).seq + 2, "x", "x")])
                 for i in ids]
        steps[30] = StepCommit(moved(store.get(ids[30]), "c"), 1,
                               history=[hist(ids[30], 1, "b", "c")])  # seq 1 again
        with pytest.raises(StepRejected) as err:
            store.commit(steps)
        assert (err.value.index, err.value.instance_id) == (30, ids[30])
        assert [store.get(i).state for i in ids] == ["start"] * 30 + ["b"] + ["start"] * 9
        rest = steps[:30] + steps[31:]
        assert store.commit(rest) == [True] * 39
        assert [len(store.history(i)) for i in ids] == [2] * 30 + [1] + [2] * 9
