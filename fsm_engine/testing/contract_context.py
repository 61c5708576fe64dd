"""Contract cases for large context values stored beside the instance row (format 9).

A value whose JSON is longer than ``codec.CONTEXT_THRESHOLD`` lives in ``blobs``
by SHA-256 and ``InstanceRecord.context_refs`` names it; every read gives the
whole context back, and a step that leaves such a value alone keeps its hash
(nothing is encoded or rewritten for it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..runtime.fleet.adoption import claim_request
from ..store import InstanceFilter, InstanceRecord, StepCommit, Store
from ..store.codec import CONTEXT_THRESHOLD, INPUT_REF
from .contract_fixtures import hist, live, moved, record

#: A value well above the threshold, with text a JSON encoder must escape.
BIG = "line \"quoted\" ☃\n" * (CONTEXT_THRESHOLD // 8)


def big_record(iid: str, **kw: Any) -> InstanceRecord:
    rec = record(iid, **kw)
    rec.context = {"n": 0, "doc": BIG, "items": [{"k": i} for i in range(600)]}
    rec.input = {"doc": BIG, "n": 0}
    return rec


class LargeValueContract:
    """Large context values round-trip through every read and survive steps unchanged."""

    def test_large_values_go_beside_the_row_and_read_back_everywhere(self, store: Store) -> None:
        rec = big_record("a", status="running")
        store.create(rec)
        assert set(rec.context_refs) == {"doc", "items", INPUT_REF + "doc"}
        got = store.get("a")
        assert got == rec and got.context["doc"] == BIG and got.input == {"doc": BIG, "n": 0}
        assert store.list()[0].context == rec.context
        assert store.query(InstanceFilter())[0].context == rec.context
        live(store, "w1")
        [claimed] = store.claim(claim_request("w1", now=1500.0))
        assert claimed.context == rec.context and claimed.input == rec.input
        assert store.get("a").context_refs == rec.context_refs

    def test_an_input_of_the_contexts_very_values_shares_its_blobs(self, store: Store) -> None:
        """A fresh start (``Engine.start``: the input holds the context's very values) is
        encoded once: the input's large values are the context's blobs."""
        rec = big_record("a")
        rec.input = dict(rec.context)
        store.create(rec)
        assert set(rec.context_refs) == {"doc", "items", INPUT_REF + "doc", INPUT_REF + "items"}
        assert rec.context_refs[INPUT_REF + "doc"] == rec.context_refs["doc"]
        got = store.get("a")
        assert got.input == rec.context and got.context == rec.context
        new = moved(got, "next", context={**got.context, "n": 1, "doc": "short"})
        assert store.commit([StepCommit(new, 0, [hist("a", 1, "start", "next")],
                                        before=got)]) == [True]
        got = store.get("a")
        assert got.input == rec.context and got.context["doc"] == "short"

    def test_a_commit_without_before_keeps_the_large_input(self, store: Store) -> None:
        store.create(big_record("a"))
        base = store.get("a")
        new = replace(base, seq=1, context={**base.context, "n": 1})
        assert store.commit([StepCommit(new, base.version)]) == [True]  # no ``before``
        got = store.get("a")
        assert got.input == {"doc": BIG, "n": 0} and got.context == new.context

    def test_a_step_that_leaves_a_large_value_alone_keeps_its_hash(self, store: Store) -> None:
        store.create(big_record("a"))
        base = store.get("a")
        new = moved(base, "next", context={**base.context, "n": 1})  # the same objects
        assert store.commit([StepCommit(new, 0, [hist("a", 1, "start", "next")],
                                        before=base)]) == [True]
        assert new.context_refs == base.context_refs
        got = store.get("a")
        assert got.context == {**base.context, "n": 1} and got.context_refs == base.context_refs

    def test_a_changed_large_value_gets_a_new_hash_and_reads_back(self, store: Store) -> None:
        store.create(big_record("a"))
        base = store.get("a")
        doc = BIG + "more"
        new = moved(base, "next", context={**base.context, "doc": doc})
        assert store.commit([StepCommit(new, 0, before=base)]) == [True]
        assert new.context_refs["doc"] != base.context_refs["doc"]
        assert new.context_refs["items"] == base.context_refs["items"]
        assert store.get("a").context["doc"] == doc

    def test_a_large_value_that_shrinks_comes_back_inline(self, store: Store) -> None:
        store.create(big_record("a"))
        base = store.get("a")
        new = moved(base, "next", context={**base.context, "doc": "short", "items": []})
        assert store.commit([StepCommit(new, 0, before=base)]) == [True]
        assert new.context_refs == {INPUT_REF + "doc": base.context_refs[INPUT_REF + "doc"]}
        got = store.get("a")
        assert (got.context["doc"], got.context["items"], got.input) == ("short", [], {"doc": BIG, "n": 0})

    def test_a_large_value_edited_in_place_in_a_shared_dict_is_written(self,
                                                                        store: Store) -> None:
        store.create(big_record("a"))
        base = store.get("a")
        new = replace(base, seq=1)  # shares base.context
        new.context["doc"] = BIG + "edited"
        assert store.commit([StepCommit(new, 0, before=base)]) == [True]
        assert store.get("a").context["doc"] == BIG + "edited"

    def test_children_and_equal_values_share_one_stored_copy(self, store: Store) -> None:
        store.create(big_record("a"), big_record("b"))
        a, b = store.get("a"), store.get("b")
        assert a.context_refs == b.context_refs  # by content: one copy for both
        parent = store.get("a")
        kid = replace(big_record("a.1.0"), parent_id="a", branch="0")
        new = moved(parent, "fan", status="waiting", reason="children")
        assert store.commit([StepCommit(new, 0, create=[kid], before=parent)]) == [True]
        assert store.children("a")[0].context["doc"] == BIG
        done = store.get("a.1.0")
        assert store.commit([StepCommit(moved(done, "end", status="completed"),
                                        done.version, before=done)]) == [True]
        [out] = store.child_outputs("a")  # a join's read puts the large values back too
        assert out.context == big_record("a").context and out.input == {"doc": BIG, "n": 0}

    def test_text_search_looks_inside_the_values_beside_the_row(self, store: Store) -> None:
        found = big_record("a")
        found.context["doc"] = BIG + "Needle in a 100% haystack"
        given = big_record("b")  # the text only in its start input: not searched, as inline
        given.input = {"doc": BIG + "needle only in the input", "n": 0}
        store.create(found, given, big_record("c"), record("d"))
        assert {k for k in given.context_refs if k.startswith(INPUT_REF)} == {INPUT_REF + "doc"}
        ids = lambda text: sorted(  # noqa: E731
            r.id for r in store.query(InstanceFilter(text=text), limit=None))
        assert ids("NEEDLE in a 100%") == ["a"]  # case-insensitive, a literal %
        assert ids("in a 1_0% h") == [] and ids("only in the input") == []
        assert ids("line") == ["a", "b", "c"]  # one stored copy, every instance holding it
        assert store.count(InstanceFilter(text="needle")) == {None: 1}
        base = store.get("a")  # a step that keeps the value keeps it found
        new = moved(base, "next", context={**base.context, "n": 1})
        assert store.commit([StepCommit(new, 0, [hist("a", 1, "start", "next")],
                                        before=base)]) == [True]
        assert [s.instance_id for s in store.steps(InstanceFilter(text="needle"))] == ["a"]
        base = store.get("a")  # the value changes: the search follows the row's new refs
        new = moved(base, "end", context={**base.context, "doc": "short"})
        assert store.commit([StepCommit(new, base.version, before=base)]) == [True]
        assert ids("needle") == [] and ids("short") == ["a"]
