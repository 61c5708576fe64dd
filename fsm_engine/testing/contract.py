"""The ``Store`` contract as a reusable test suite (pytest).

Every backend passes the same tests: ``tests/store/test_store_contract.py`` runs
them against SQLite and PostgreSQL, and a third-party backend runs them by
subclassing :class:`StoreContract` with a ``store`` fixture::

    import pytest
    from fsm_engine.testing import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            s = MyStore(...)
            yield s
            s.close()
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..errors import InstanceNotFound, InvalidInput, StepRejected, StoreError
from ..store import (
    BreakerRow,
    ClaimRequest,
    HistoryRow,
    InstanceFilter,
    OutboxBegin,
    StepCommit,
    Store,
    WorkerRow,
)
from .contract_fixtures import (  # noqa: F401 - re-exported for backends' own tests
    UNICODE,
    attempt,
    concurrently,
    fleet,
    hist,
    live,
    moved,
    record,
)


class ReadSideContract:
    """``query``, ``count``, ``steps``, ``delete`` and ``check`` (the read side of the viewer,
    ``fsm stats``/``list``/``prune``/``check``); part of :class:`StoreContract`."""

    def test_query_filters_by_each_field(self, store: Store) -> None:
        fleet(store)
        ids = lambda **kw: sorted(r.id for r in store.query(InstanceFilter(**kw), limit=None))  # noqa: E731
        assert ids() == ["a", "b", "c", "d", "e"]
        assert ids(machine="m2") == ["d"]
        assert ids(statuses=("completed", "failed")) == ["a", "b", "d"]
        assert ids(statuses=()) == []
        assert ids(machine="m1", states=("done", "work")) == ["a", "c"]
        assert ids(reasons=("timeout",)) == ["b"]
        assert ids(text="needle") == ["d"]  # case-insensitive, inside the context
        assert ids(text="%") == [] and ids(text="_") == []  # LIKE wildcards are literal
        assert ids(created_after=1010.0, created_before=1030.0) == ["b", "c"]
        assert ids(updated_after=1130.0) == ["d", "e"]

    def test_query_sorts_and_pages(self, store: Store) -> None:
        fleet(store)
        page = lambda **kw: [r.id for r in store.query(InstanceFilter(), **kw)]  # noqa: E731
        assert page() == ["e", "d", "c", "b", "a"]  # newest first by default
        assert page(descending=False, limit=2) == ["a", "b"]
        assert page(descending=False, limit=2, offset=2) == ["c", "d"]
        assert page(order="tokens", limit=3) == ["c", "a", "b"]
        assert page(order="tokens", descending=False) == ["d", "e", "b", "a", "c"]  # ties by age
        assert page(order="transitions", limit=1) == ["a"]
        assert page(order="updated", limit=1) == ["e"]
        with pytest.raises(InvalidInput):
            store.query(InstanceFilter(), order="size")

    def test_count_by_group_and_context_field(self, store: Store) -> None:
        fleet(store)
        assert store.count(InstanceFilter()) == {None: 5}
        assert store.count(InstanceFilter(machine="nope")) == {}
        assert store.count(InstanceFilter(), "status") == \
            {"completed": 2, "failed": 1, "running": 1, "pending": 1}
        assert store.count(InstanceFilter(machine="m1"), "state") == \
            {"done": 1, "failed": 1, "work": 1, "start": 1}
        assert store.count(InstanceFilter(), "reason") == {None: 4, "timeout": 1}
        assert store.count(InstanceFilter(), "machine") == {"m1": 4, "m2": 1}
        assert store.count(InstanceFilter(), "context.src") == {"model": 2, "rules": 2, None: 1}
        assert store.count(InstanceFilter(machine="m1"), "context.n") == \
            {"1": 1, "2": 1, "3": 1, "5": 1}
        for bad in ("context", "context.a.b", "owner; DROP TABLE instances", "context.x'"):
            with pytest.raises(InvalidInput):
                store.count(InstanceFilter(), bad)

    def test_steps_are_history_rows_in_instance_then_seq_order(self, store: Store) -> None:
        fleet(store)
        rows = list(store.steps(InstanceFilter(machine="m1")))
        assert [(r.instance_id, r.seq) for r in rows] == \
            [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]
        first = rows[0]
        assert (first.machine, first.status, first.created_at, first.source, first.dest) == \
            ("m1", "completed", 1000.0, "start", "work")
        assert (first.tokens, first.duration_ms, first.attempt, first.reasks, first.llm_calls) == \
            (10, 2.0, 2, 1, 2)
        assert (rows[1].attempt, rows[1].reasks, rows[1].llm_calls) == (1, 0, 0)
        assert rows[4].kind == "fallback" and rows[4].dest == "failed"
        assert list(store.steps(InstanceFilter(statuses=("pending",)))) == []

    def test_steps_leave_a_joins_children_tokens_out(self, store: Store) -> None:
        store.create(record("p"))
        parent = store.get("p")
        join = hist("p", 1, "start", "done", kind="join", tokens=95,
                    detail={"children_tokens": 90, "branches": {"succeeded": 3}})
        store.commit([StepCommit(moved(parent, "done", tokens=95), parent.version, [join])])
        assert [r.tokens for r in store.steps(InstanceFilter(machine="m"))] == [5]
        assert store.history("p")[0].tokens == 95 and store.get("p").tokens_used == 95

    def test_delete_removes_every_row_of_the_instances_only(self, store: Store) -> None:
        fleet(store)
        assert store.delete(["a", "b", "zz", "a"]) == 2
        assert sorted(r.id for r in store.list()) == ["c", "d", "e"]
        for gone in ("a", "b"):
            with pytest.raises(InstanceNotFound):
                store.history(gone)
            assert store.attempts(gone) == [] and store.outbox(gone) == []
        assert [r.seq for r in store.history("c")] == [1]
        assert store.check() == []
        assert store.delete([]) == 0

    def test_check_is_clean_then_finds_a_gap_and_a_state_mismatch(self, store: Store) -> None:
        fleet(store)
        assert store.check() == []
        gap = store.get("c")  # history 1, then a row numbered 3
        store.commit([StepCommit(replace(gap, seq=3, state="check"), gap.version,
                                 [hist("c", 3, "work", "check")])])
        odd = store.get("d")  # the row says it went to "done", the record says "elsewhere"
        store.commit([StepCommit(replace(odd, state="elsewhere"), odd.version)])
        problems = store.check()
        assert len(problems) == 2, problems
        assert any("instance c" in p and "gap" in p for p in problems)
        assert any("instance d" in p and "'elsewhere'" in p and "'done'" in p for p in problems)


from .contract_batch import BatchContract  # noqa: E402 - uses the helpers above
from .contract_context import LargeValueContract  # noqa: E402 - uses the helpers above
from .contract_definitions import DefinitionContract, MetaContract  # noqa: E402
from .contract_leases import LeaseContract  # noqa: E402 - uses the helpers above
from .contract_queues import QueueContract  # noqa: E402 - uses the helpers above
from .contract_reviews import ForkContract, ReplyContract, ReviewContract  # noqa: E402 - uses the helpers above
from .contract_streams import StreamContract  # noqa: E402


class StoreContract(ReadSideContract, ReviewContract, ForkContract, ReplyContract,
                    QueueContract, LargeValueContract, LeaseContract, BatchContract,
                    DefinitionContract, StreamContract, MetaContract):
    """Behaviour every ``Store`` backend must have (including :class:`ReadSideContract`).

    Subclass it in a test module (name the subclass ``Test…``) and provide a
    ``store`` fixture yielding a fresh, empty store of the backend under test;
    every test then runs against it.
    """

    # -- create / get / list -----------------------------------------------------------
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

    # -- commit ------------------------------------------------------------------------
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

    # -- outbox ------------------------------------------------------------------------
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

    # -- workers -----------------------------------------------------------------------
    def test_workers_put_list_update_delete(self, store: Store) -> None:
        w1 = WorkerRow(id="w1", host="h", pid=10, pid_start="123", started_at=1.0,
                       heartbeat_at=2.0)
        w2 = WorkerRow(id="w2", host="h2", pid=11, pid_start="456", started_at=1.5,
                       heartbeat_at=2.5)
        store.put_worker(w1)
        store.put_worker(w2)
        assert sorted(store.workers(), key=lambda w: w.id) == [w1, w2]
        store.put_worker(replace(w1, heartbeat_at=9.0))
        assert {w.id: w.heartbeat_at for w in store.workers()} == {"w1": 9.0, "w2": 2.5}
        store.delete_worker("w1")
        store.delete_worker("never-registered")
        assert store.workers() == [w2]

    # -- breakers ----------------------------------------------------------------------
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

    # -- JSON --------------------------------------------------------------------------
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

    # -- leases: claim, held, release -------------------------------------------------------
    def test_worker_lease_and_queues_round_trip(self, store: Store) -> None:
        w = WorkerRow(id="w", host="h", pid=1, pid_start="9", started_at=1.0, heartbeat_at=2.0,
                      lease_until=7.0, queues=["llm", "io"])
        store.put_worker(w)
        assert store.workers() == [w]

    def test_claim_takes_runnable_unowned_instances_oldest_first(self, store: Store) -> None:
        store.create(record("a"), record("b", status="running"), record("c", status="waiting"),
                     record("d", status="completed"), record("e", status="cancelled"))
        later = record("f", status="running")
        later.next_attempt_at = 2000.0  # in a retry backoff until then
        store.create(later)
        live(store, "w1", "w2")
        got = store.claim(ClaimRequest("w1", now=1500.0, limit=10))
        assert [(r.id, r.owner, r.status, r.version) for r in got] == \
            [("a", "w1", "running", 1), ("b", "w1", "running", 1)]
        assert [store.get(i) for i in ("a", "b")] == got
        assert store.claim(ClaimRequest("w2", now=1500.0)) == []  # nothing left for others
        assert [r.id for r in store.claim(ClaimRequest("w2", now=2000.0))] == ["f"]  # now due

    def test_claim_honours_the_limit(self, store: Store) -> None:
        store.create(*[record(f"i{n}") for n in range(5)])
        live(store, "w1", "w2")
        first = store.claim(ClaimRequest("w1", now=1.0, limit=2))
        second = store.claim(ClaimRequest("w2", now=1.0, limit=10))
        assert [r.id for r in first] == ["i0", "i1"]
        assert [r.id for r in second] == ["i2", "i3", "i4"]

    def test_claim_skips_live_leases_and_takes_expired_ones(self, store: Store) -> None:
        now = 5000.0
        store.put_worker(WorkerRow("live", "h", 1, "1", 0.0, now - 1, lease_until=now + 5))
        store.put_worker(WorkerRow("expired", "h", 2, "2", 0.0, now - 9, lease_until=now - 1))
        store.put_worker(WorkerRow("old-row", "h", 3, "3", 0.0, now - 20))  # no lease_until
        store.create(record("held", status="running", owner="live"),
                     record("orphan", status="running", owner="expired"),
                     record("old", status="running", owner="old-row"),
                     record("ghost", status="pending", owner="no-such-worker"))
        live(store, "me")
        got = store.claim(ClaimRequest("me", now=now, lease_seconds=10.0))
        assert [r.id for r in got] == ["orphan", "old", "ghost"]
        assert store.get("held").owner == "live"
        taken = store.claim(ClaimRequest("other", now=now, dead=["live"]))
        assert [r.id for r in taken] == ["held"]

    def test_claim_counts_a_recovery_from_a_dead_owner_mid_step(self, store: Store) -> None:
        store.put_worker(WorkerRow("dead", "h", 1, "1", 0.0, 100.0, lease_until=110.0))
        mid = record("mid", status="running", owner="dead")
        asleep = record("asleep", status="running", owner="dead")
        asleep.next_attempt_at = 105.0  # its retry was due after the owner's last heartbeat
        fresh = record("fresh", status="pending")
        store.create(mid, asleep, fresh)
        got = {r.id: r for r in store.claim(ClaimRequest("me", now=200.0, due_by=float("inf")))}
        # the takeover's history row is seq 1, and it is no progress: recovered_seq is past it
        assert (got["mid"].recoveries, got["mid"].seq, got["mid"].recovered_seq) == (1, 1, 1)
        assert got["asleep"].recoveries == 0 and got["fresh"].recoveries == 0
        assert store.get("mid") == got["mid"]
        assert [h.kind for h in store.history("mid")] == ["recovery"]
        assert [h.kind for h in store.history("asleep")] == ["recovery"]
        assert store.history("fresh") == []  # nobody held it: nothing to record

    def test_claim_records_a_takeover_as_a_recovery_row(self, store: Store) -> None:
        now = 5000.0
        store.put_worker(WorkerRow("hostA:41:aa", "hostA", 41, "9", 0.0, now - 9,
                                   lease_until=now - 1))
        store.put_worker(WorkerRow("hostA:42:bb", "hostA", 42, "9", 0.0, now - 1,
                                   lease_until=now + 5))
        expired, gone = record("exp", status="running", owner="hostA:41:aa"), record(
            "gone", status="running", owner="hostA:42:bb")
        expired.seq = gone.seq = 0
        ghost = record("ghost", status="pending", owner="no-such-worker")
        mine, free = record("mine", status="running", owner="hostB:7:cc"), record("free")
        store.create(expired, gone, ghost, mine, free)
        live(store, "hostB:7:cc")
        got = store.claim(ClaimRequest("hostB:7:cc", now=now, own=True, dead=["hostA:42:bb"]))
        assert [r.id for r in got] == ["exp", "gone", "ghost", "mine", "free"]
        assert store.history("mine") == [] and store.history("free") == []  # no takeover
        rows = {iid: store.history(iid) for iid in ("exp", "gone", "ghost")}
        assert all(len(r) == 1 for r in rows.values())
        row = rows["exp"][0]
        assert (row.seq, row.kind, row.trigger, row.source, row.dest, row.tokens, row.delta,
                row.at) == (1, "recovery", "recovery", "start", "start", 0, {}, now)
        assert row.detail["recovery"] == {
            "from": "hostA:41:aa", "from_host": "hostA", "from_pid": 41, "to": "hostB:7:cc",
            "to_host": "hostB", "to_pid": 7, "cause": "lease_expired", "status": "running",
            "mid_step": True, "last_heartbeat": now - 9, "recoveries": 1}
        assert rows["gone"][0].detail["recovery"]["cause"] == "process_gone"
        info = rows["ghost"][0].detail["recovery"]
        assert (info["cause"], info["status"], info["mid_step"], info["from_host"],
                info["last_heartbeat"], info["recoveries"]) == (
                    "deregistered", "pending", False, None, None, 0)
        assert store.get("ghost").recoveries == 0  # never started: not a crash recovery
        assert store.check() == []  # seq gap-free, state equals the last row's dest

    def test_recovery_rows_are_not_progress(self, store: Store) -> None:
        """Takeovers without a committed step in between keep counting; a step resets."""
        store.create(record("i", status="running", owner="w0"))
        for n in (1, 2):
            rec = store.claim(ClaimRequest(f"w{n}", now=100.0 * n))[0]
            assert (rec.seq, rec.recoveries, rec.recovered_seq) == (n, n, n)
        step = moved(rec, "next")
        assert store.commit([StepCommit(step, rec.version, history=[HistoryRow(
            "i", step.seq, "start", "next", "go", 250.0)], before=rec)]) == [True]
        rec = store.claim(ClaimRequest("w3", now=300.0))[0]
        assert (rec.seq, rec.recoveries, rec.recovered_seq) == (4, 1, 4)
        assert [h.kind for h in store.history("i")] == [
            "recovery", "recovery", "transition", "recovery"]
        assert [h.seq for h in store.history("i")] == [1, 2, 3, 4]
        assert store.check() == []

    def test_claim_own_and_machines_filters(self, store: Store) -> None:
        live(store, "me")
        store.create(record("mine", owner="me"), record("x", machine="other"), record("y"))
        assert [r.id for r in store.claim(ClaimRequest("me", now=200.0, machines=["m"]))] == ["y"]
        assert store.claim(ClaimRequest("me", now=200.0, machines=[])) == []
        assert [r.id for r in store.claim(ClaimRequest("me", now=200.0, own=True,
                                                       machines=["m"]))] == ["mine", "y"]

    def test_held_and_release(self, store: Store) -> None:
        store.create(record("a"), record("b"), record("c"))
        live(store, "w1", "w2")
        got = store.claim(ClaimRequest("w1", now=1.0))
        assert store.held("w1") == {"a": "running", "b": "running", "c": "running"}
        assert store.release("w1", ["a", "nope"]) == 1
        assert store.release("w2") == 0 and store.release("w1", []) == 0
        assert store.held("w1") == {"b": "running", "c": "running"}
        stale = StepCommit(moved(got[0], "next"), got[0].version)
        assert store.commit([stale]) == [False]  # a release fences the old owner's writes
        assert store.get("a").owner is None and store.get("a").version == 2
        assert store.release("w1") == 2 and store.held("w1") == {}
        assert [r.id for r in store.claim(ClaimRequest("w2", now=2.0))] == ["a", "b", "c"]

    def test_wait_for_work_returns_within_its_timeout(self, store: Store) -> None:
        store.wait_for_work(0.05)  # nothing happens: it returns anyway

    def test_concurrent_claimers_never_share_an_instance(self, store: Store, reopen) -> None:
        store.create(*[record(f"i{n:03}") for n in range(120)])
        live(store, "w0", "w1", "w2", "w3")
        others = [reopen() for _ in range(3)]
        taken: dict[str, list[str]] = {}

        def claim_all(n: int, s: Store) -> None:
            name = f"w{n}"
            mine = taken.setdefault(name, [])
            while True:
                got = s.claim(ClaimRequest(name, now=1.0, limit=7))
                if not got:
                    return
                mine.extend(r.id for r in got)
        concurrently(claim_all, store, others)
        every = [i for ids in taken.values() for i in ids]
        assert sorted(every) == [f"i{n:03}" for n in range(120)]  # each exactly once
        owners = {r.id: r.owner for r in store.list()}
        assert all(owners[i] == name for name, ids in taken.items() for i in ids)

    # -- families (fan-out children, joins) -----------------------------------------------
    def test_children_are_created_with_their_parents_move(self, store: Store) -> None:
        store.create(record("p"))
        parent = store.get("p")
        kids = [replace(record(f"p.1.{n}"), parent_id="p", branch=str(n)) for n in range(3)]
        new = moved(parent, "fan", status="waiting", reason="children")
        assert store.commit([StepCommit(new, parent.version, [hist("p", 1, "start", "fan")],
                                        create=kids, before=parent)]) == [True]
        assert all(k.key is not None for k in kids)
        got = store.children("p")
        assert [(c.id, c.parent_id, c.branch) for c in got] == \
            [("p.1.0", "p", "0"), ("p.1.1", "p", "1"), ("p.1.2", "p", "2")]
        assert store.get("p").status == "waiting" and [h.seq for h in store.history("p")] == [1]
        assert store.children("p.1.0") == [] and store.children("nobody") == []

    def test_child_states_are_the_children_without_their_json(self, store: Store) -> None:
        store.create(record("p"), replace(record("p.1.0"), parent_id="p", branch="a"),
                     replace(record("p.1.1", status="failed"), tokens_used=7, parent_id="p",
                             branch="b", reason="token_budget"), record("q"))
        kid = store.get("p.1.0")
        store.commit([StepCommit(moved(kid, "end", status="completed"), kid.version)])
        got = store.child_states("p")
        assert [tuple(c) for c in got] == [
            ("p.1.0", kid.version + 1, "completed", None, "a", 0, None),
            ("p.1.1", 0, "failed", "token_budget", "b", 7, None)]
        assert [c.final for c in got] == [True, True]
        assert [(c.id, c.version, c.status, c.reason, c.branch, c.tokens_used, c.owner)
                for c in store.children("p")] == [tuple(c) for c in got]
        assert store.child_states("q") == [] and store.child_states("nobody") == []

    def test_child_outputs_are_the_final_childrens_context_and_input(self, store: Store) -> None:
        store.create(record("p"), *[replace(record(f"p.1.{n}"), parent_id="p", branch=str(n))
                                    for n in range(3)], record("q"))
        for n, status in ((2, "failed"), (0, "completed")):
            kid = store.get(f"p.1.{n}")
            store.commit([StepCommit(moved(kid, "end", status=status,
                                           context={"n": n + 1, "s": "y"}), kid.version)])
        got = store.child_outputs("p")  # p.1.1 still pending: not there
        assert [tuple(o) for o in got] == [
            ("p.1.0", {"n": 1, "s": "y"}, {"n": 0, "s": "x"}),
            ("p.1.2", {"n": 3, "s": "y"}, {"n": 0, "s": "x"})]
        full = {c.id: c for c in store.children("p")}
        assert all(full[o.id].context == o.context and full[o.id].input == o.input for o in got)
        assert store.child_outputs("q") == [] and store.child_outputs("nobody") == []

    def test_a_stale_parent_creates_no_children(self, store: Store) -> None:
        store.create(record("p"))
        parent = store.get("p")
        store.commit([StepCommit(moved(parent, "other"), parent.version)])
        kids = [replace(record("p.1.0"), parent_id="p", branch="0")]
        assert store.commit([StepCommit(moved(parent, "fan"), parent.version,
                                        create=kids)]) == [False]
        assert store.children("p") == [] and kids[0].key is None
        with pytest.raises(InstanceNotFound):
            store.get("p.1.0")

    def test_a_duplicate_child_undoes_the_parents_move(self, store: Store) -> None:
        store.create(record("p"), replace(record("p.1.0"), parent_id="p", branch="0"))
        parent = store.get("p")
        kids = [replace(record(f"p.1.{n}"), parent_id="p", branch=str(n)) for n in range(2)]
        ok = store.commit([StepCommit(moved(parent, "fan"), parent.version,
                                      [hist("p", 1, "start", "fan")], create=kids)])
        assert ok == [False]
        assert store.get("p").state == "start" and store.get("p").version == 0
        assert store.history("p") == [] and [c.id for c in store.children("p")] == ["p.1.0"]

    def test_fence_and_also_apply_with_the_step_or_not_at_all(self, store: Store) -> None:
        store.create(record("p", status="waiting"), replace(record("p.1.0"), parent_id="p"),
                     replace(record("p.1.1"), parent_id="p"))
        parent, done, busy = store.get("p"), store.get("p.1.0"), store.get("p.1.1")
        cancel = StepCommit(moved(busy, "start", status="cancelled"), busy.version)
        join = StepCommit(moved(parent, "next"), parent.version, fence=[("p.1.0", done.version)],
                          also=[cancel])
        store.commit([StepCommit(moved(done, "end", status="completed"), done.version)])
        assert store.commit([join]) == [False]  # the fenced child moved on after it was read
        assert store.get("p").state == "start" and store.get("p.1.1").status == "pending"
        done = store.get("p.1.0")
        cancel = StepCommit(moved(busy, "start", status="cancelled"), busy.version)
        join = StepCommit(moved(parent, "next"), parent.version, fence=[("p.1.0", done.version)],
                          also=[cancel], history=[hist("p", 1, "start", "next")])
        assert store.commit([join]) == [True]
        assert (store.get("p").state, store.get("p.1.1").status) == ("next", "cancelled")
        assert cancel.record.version == busy.version + 1
        assert store.get("p.1.0").version == done.version  # read, not written

    def test_a_stale_also_step_undoes_the_whole_step(self, store: Store) -> None:
        store.create(record("p"), replace(record("p.1.0"), parent_id="p"))
        parent, kid = store.get("p"), store.get("p.1.0")
        store.commit([StepCommit(moved(kid, "x"), kid.version)])
        step = StepCommit(moved(parent, "next"), parent.version,
                          also=[StepCommit(moved(kid, "y"), kid.version)])
        assert store.commit([step]) == [False]
        assert store.get("p").state == "start" and store.get("p.1.0").state == "x"

    def test_wake_makes_a_parent_waiting_for_children_claimable(self, store: Store) -> None:
        store.create(record("p"), replace(record("p.1.0", status="running"), parent_id="p"))
        parent = store.get("p")
        store.commit([StepCommit(replace(parent, status="waiting", reason="children"),
                                 parent.version)])
        assert store.claim(ClaimRequest("w", now=1.0, limit=5, machines=["none"])) == []
        kid = store.get("p.1.0")
        before = store.get("p").version
        assert store.commit([StepCommit(moved(kid, "end", status="completed"), kid.version,
                                        wake="p")]) == [True]
        woke = store.get("p")
        assert (woke.status, woke.version) == ("running", before + 1)
        assert store.commit([StepCommit(store.get("p.1.0"), store.get("p.1.0").version,
                                        wake="p")]) == [True]
        assert store.get("p").version == before + 1  # waking a running parent changes nothing
        assert [r.id for r in store.claim(ClaimRequest("w", now=1.0))] == ["p"]
