"""Contract cases for the read side (mixed into ``StoreContract``): ``query``, ``count``,
``steps``, ``delete`` and ``check``, what the viewer, ``fsm stats``/``list``/``prune``/
``check`` read.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..errors import InstanceNotFound, InvalidInput
from ..store import InstanceFilter, StepCommit, Store
from .contract_fixtures import fleet, hist, moved, record


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

    def test_a_versioned_delete_takes_only_ended_instances_still_at_their_version(
            self, store: Store) -> None:
        """A prune's compare-and-set (issue 37): ``a`` moved on since it was read, ``c``
        is running, ``zz`` is gone: only ``d`` is deleted."""
        fleet(store)
        seen = {r.id: r.version for r in store.list()}
        a = store.get("a")
        store.commit([StepCommit(replace(a, reason="reviewed"), a.version)])
        ids = ["a", "c", "d", "zz"]
        assert store.delete(ids, versions=[seen.get(i, 0) for i in ids]) == 1
        assert sorted(r.id for r in store.list()) == ["a", "b", "c", "e"]
        assert store.history("a") and store.outbox("a")  # its rows stay with it
        assert store.check() == []
        with pytest.raises(ValueError):
            store.delete(["a"], versions=[])

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
