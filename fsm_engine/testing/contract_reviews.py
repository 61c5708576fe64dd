"""The review-queue part of the ``Store`` contract (mixed into ``StoreContract``)."""

from __future__ import annotations

from ..runtime.fleet.adoption import claim_request
from ..store import ReviewDecision, ReviewItem, StepCommit, Store


def item(iid: str, item_id: str = "r1", *, machine: str = "m", at: float = 1001.0,
         due: float | None = None) -> ReviewItem:
    """An open review item of instance ``iid`` in state ``review``, visit 1."""
    return ReviewItem(id=item_id, instance_id=iid, machine=machine, state="review", visit=1,
                      prompt="Is this right?", show={"s": "x", "ключ": ["é"]},
                      choices=["approve", "reject"], editable=["s"], created_at=at, due_at=due,
                      on_timeout="reject" if due else None)


def _enter_review(store: Store, iid: str, item_id: str = "r1", **kw: object) -> None:
    from .contract_fixtures import hist, moved, record
    store.create(record(iid))
    new = moved(store.get(iid), "review", status="waiting")
    assert store.commit([StepCommit(new, 0, [hist(iid, 1, "start", "review")],
                                    review_open=item(iid, item_id, **kw))]) == [True]  # type: ignore[arg-type]


def _decision(store: Store, iid: str, item_id: str = "r1", *, by: str = "ann",
              claimer: str | None = "ann", version: int = 1) -> StepCommit:
    from .contract_fixtures import hist, moved
    new = moved(store.get(iid), "done", status="completed", context={"n": 0, "s": "edited"})
    return StepCommit(new, version, [hist(iid, 2, "review", "done")],
                      review_close=ReviewDecision(item_id, by, 1002.0, "approve", "looks fine",
                                                  {"s": "edited"}, claimer))


class ReviewContract:
    """Review items: opened with a step, claimed and decided by compare-and-set."""

    def test_review_opens_with_its_step_and_round_trips(self, store: Store) -> None:
        _enter_review(store, "a", due=2000.0)
        assert store.reviews() == [item("a", due=2000.0)]
        assert store.reviews(statuses=["open"], machine="m", instance_id="a", id_prefix="r")
        assert store.reviews(statuses=["decided"]) == [] and store.reviews(machine="x") == []

    def test_a_second_open_of_the_same_item_keeps_the_first(self, store: Store) -> None:
        _enter_review(store, "a")
        rec = store.get("a")
        again = item("a", at=5000.0)
        assert store.commit([StepCommit(rec, rec.version, review_open=again)]) == [True]
        assert store.reviews()[0].created_at == 1001.0

    def test_a_stale_step_opens_no_review(self, store: Store) -> None:
        from .contract_fixtures import moved, record
        store.create(record("a"))
        new = moved(store.get("a"), "review", status="waiting")
        assert store.commit([StepCommit(new, 5, review_open=item("a"))]) == [False]
        assert store.reviews() == []

    def test_decision_closes_the_item_and_applies_the_step_together(self, store: Store) -> None:
        _enter_review(store, "a")
        assert store.commit([_decision(store, "a")]) == [True]
        got = store.reviews()[0]
        assert (got.status, got.decided_by, got.decided_at, got.choice, got.note, got.edit) == \
            ("decided", "ann", 1002.0, "approve", "looks fine", {"s": "edited"})
        assert store.get("a").state == "done" and len(store.history("a")) == 2

    def test_second_decision_applies_nothing(self, store: Store) -> None:
        _enter_review(store, "a")
        assert store.commit([_decision(store, "a")]) == [True]
        rec = store.get("a")
        assert store.commit([_decision(store, "a", by="bob", claimer="bob", version=2)]) == [False]
        assert store.get("a") == rec and store.reviews()[0].decided_by == "ann"

    def test_decision_with_a_stale_instance_version_leaves_the_item_open(self,
                                                                         store: Store) -> None:
        _enter_review(store, "a")
        assert store.commit([_decision(store, "a", version=7)]) == [False]
        assert store.reviews()[0].status == "open" and store.get("a").state == "review"
        assert len(store.history("a")) == 1

    def test_a_step_closing_reviews_closes_its_instances_open_items_only(
            self, store: Store) -> None:
        """``StepCommit.close_reviews`` (a cancel, a send): the instance's open items are
        closed undecided with the note, in the step's transaction; a stale step closes
        none; other instances' items stay open (issue 36)."""
        from dataclasses import replace

        from .contract_fixtures import hist
        _enter_review(store, "a")
        _enter_review(store, "b", "r2")
        rec = store.get("a")
        gone = replace(rec, status="cancelled", seq=2, updated_at=1500.0)
        cancel = [hist("a", 2, "review", "review", kind="cancel")]
        stale = StepCommit(gone, rec.version + 5, cancel, close_reviews=("ops", "cancelled"))
        assert store.commit([stale]) == [False]
        assert [r.status for r in store.reviews()] == ["open", "open"]
        step = StepCommit(gone, rec.version, cancel, close_reviews=("ops", "cancelled"))
        assert store.commit([step]) == [True]
        a, b = sorted(store.reviews(), key=lambda r: r.id)
        assert (a.status, a.decided_by, a.decided_at, a.note, a.choice) == (
            "closed", "ops", 1500.0, "cancelled", None)
        assert b.status == "open"

    def test_claim_is_compare_and_set(self, store: Store) -> None:
        _enter_review(store, "a")
        assert store.claim_review("r1", "ann", 1001.5) is True
        assert store.claim_review("r1", "ann", 1001.6) is True  # again by the claimer
        assert store.claim_review("r1", "bob", 1001.7) is False
        assert (store.reviews()[0].claimed_by, store.reviews()[0].claimed_at) == ("ann", 1001.6)
        assert store.claim_review("nope", "ann", 1.0) is False
        assert store.commit([_decision(store, "a", by="bob", claimer="bob")]) == [False]
        assert store.commit([_decision(store, "a")]) == [True]  # the claimer decides
        assert store.claim_review("r1", "ann", 1003.0) is False  # decided: no more claims

    def test_a_decision_without_claimer_ignores_the_claim(self, store: Store) -> None:
        _enter_review(store, "a")
        store.claim_review("r1", "ann", 1001.5)
        assert store.commit([_decision(store, "a", by="sla-timer", claimer=None)]) == [True]

    def test_decision_and_plain_steps_in_one_batch(self, store: Store) -> None:
        from .contract_fixtures import hist, moved, record
        _enter_review(store, "a")
        store.create(record("b"))
        plain = StepCommit(moved(store.get("b"), "middle"), 0, [hist("b", 1, "start", "middle")])
        assert store.commit([_decision(store, "a", version=9), plain]) == [False, True]
        assert store.get("b").state == "middle" and store.reviews()[0].status == "open"

    def test_a_decision_a_constraint_refuses_is_rejected_by_index(self, store: Store) -> None:
        """A decision whose rows break a unique index (its history row repeats a seq) is
        refused as any step is: ``StepRejected`` naming it (``index``) and the index's
        columns, the item still open, nothing of the batch written."""
        from dataclasses import replace

        import pytest

        from ..errors import StepRejected
        from .contract_fixtures import hist, moved, record
        _enter_review(store, "a")
        store.create(record("b"))
        before, item_before = store.get("a"), store.reviews()
        plain = StepCommit(moved(store.get("b"), "middle"), 0, [hist("b", 1, "start", "middle")])
        dup = replace(_decision(store, "a"), history=[hist("a", 1, "review", "done")])
        with pytest.raises(StepRejected) as err:
            store.commit([plain, dup])
        assert (err.value.index, err.value.instance_id) == (1, "a")
        assert "seq" in str(err.value) and "\n" not in str(err.value)
        assert store.get("a") == before and store.reviews() == item_before
        assert len(store.history("a")) == 1 and store.get("b").state == "start"
        assert store.commit([plain]) == [True]  # the rest of the batch goes again

    def test_waiting_instance_is_claimable_once_its_timer_is_due(self, store: Store) -> None:
        from .contract_fixtures import record
        _enter_review(store, "a", due=2000.0)
        rec = store.get("a")
        rec.next_attempt_at = 2000.0
        assert store.commit([StepCommit(rec, rec.version)]) == [True]
        store.create(record("plain", status="waiting"))
        assert store.claim(claim_request("w", now=1999.0, due_by=float("inf"))) == []
        [got] = store.claim(claim_request("w", now=2000.0))
        assert (got.id, got.status, got.owner) == ("a", "waiting", "w")


class ForkContract:
    """Forks: lineage columns round-trip, copied history lands with the new instance."""

    def test_create_with_history_and_lineage(self, store: Store) -> None:
        from dataclasses import replace

        from .contract_fixtures import hist, record
        rec = replace(record("f"), state="middle", seq=2, forked_from="a", forked_at_seq=2)
        rows = [hist("f", 1, "start", "x"), hist("f", 2, "x", "middle", delta={"n": 2})]
        store.create(rec, history=rows)
        got = store.get("f")
        assert (got.forked_from, got.forked_at_seq, got.seq) == ("a", 2, 2)
        assert store.history("f") == rows

    def test_create_with_history_is_all_or_nothing(self, store: Store) -> None:
        import pytest

        from .contract_fixtures import hist, record
        store.create(record("dup"))
        with pytest.raises(Exception):  # noqa: B017 - each backend refuses the duplicate its own way
            store.create(record("new"), record("dup"), history=[hist("new", 1, "start", "x")])
        assert [r.id for r in store.list()] == ["dup"]


class ReplyContract:
    """The reply cache: put, get within a time window, replace."""

    def test_reply_put_get_and_window(self, store: Store) -> None:
        from ..store import ReplyRow
        row = ReplyRow("k" * 64, "scripted", "m1", "审核 ok", "stop", 1000.0)
        assert store.get_reply(row.key, 0.0) is None
        store.put_reply(row)
        assert store.get_reply(row.key, 999.0) == row
        assert store.get_reply(row.key, 1000.5) is None  # older than the window
        newer = ReplyRow(row.key, "scripted", "m1", "again", "stop", 2000.0)
        store.put_reply(newer)
        assert store.get_reply(row.key, 1500.0) == newer
