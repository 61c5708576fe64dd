"""Contract cases for families (mixed into ``StoreContract``): fan-out children created
with their parent's move, read back by parent, fenced and cancelled with a join, and
a parent woken when a child ends.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..errors import InstanceNotFound
from ..runtime.fleet.adoption import claim_request
from ..store import StepCommit, Store
from .contract_fixtures import hist, moved, record


class FamilyContract:
    """``children`` / ``child_states`` / ``child_outputs`` and a step's ``create``, ``fence``,
    ``also`` and ``wake``."""

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
        assert store.claim(claim_request("w", now=1.0, limit=5, machines=["none"])) == []
        kid = store.get("p.1.0")
        before = store.get("p").version
        assert store.commit([StepCommit(moved(kid, "end", status="completed"), kid.version,
                                        wake="p")]) == [True]
        woke = store.get("p")
        assert (woke.status, woke.version) == ("running", before + 1)
        assert store.commit([StepCommit(store.get("p.1.0"), store.get("p.1.0").version,
                                        wake="p")]) == [True]
        assert store.get("p").version == before + 1  # waking a running parent changes nothing
        assert [r.id for r in store.claim(claim_request("w", now=1.0))] == ["p"]
