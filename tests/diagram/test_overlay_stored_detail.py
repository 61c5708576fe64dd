"""A diagram's overlay and a coverage report read stored history ``detail`` as hostile
(issue 37): a join's branch counts, an agent's tool calls, a review's decider."""

from __future__ import annotations

from typing import Any

import pytest

from fsm_engine.coverage import collect
from fsm_engine.diagram.overlays import instance_overlay, tool_calls
from fsm_engine.store.records import HistoryRow
from fsm_engine.testing.contract_fixtures import record

JUNK = [None, "x", [1], 5, True, 10**400, {"succeeded": "3"}]


def _join(branches: Any) -> HistoryRow:
    return HistoryRow("i", 1, "fan", "done", "joined", 5.0, kind="join",
                      detail={"branches": branches})


def test_a_joins_branch_counts_show_as_recorded() -> None:
    got = instance_overlay(record("i", state="done"), [_join(
        {"succeeded": 3, "failed": 1, "skipped": 0, "running": 2})])
    assert "3 succeeded · 1 failed · 0 skipped · 2 cancelled" in got["figures"]["fan"]


@pytest.mark.parametrize("junk", JUNK)
def test_a_joins_junk_counts_show_as_none(junk: Any) -> None:
    """(A count that is text is none: ``"3"`` once showed as 3.)"""
    got = instance_overlay(record("i", state="done"), [_join(junk)])
    lines = got["figures"].get("fan", [])
    assert not [t for t in lines if "succeeded" in t]


@pytest.mark.parametrize("junk", JUNK)
def test_an_agents_junk_rows_count_no_call(junk: Any) -> None:
    rows = [HistoryRow("i", 1, "a", "a", "tool", 1.0, kind="tool", detail=junk),
            HistoryRow("i", 2, "a", "a", "tool", 1.0, kind="tool",
                       detail={"agent": "call", "tool": "add", "error": "x"})]
    assert tool_calls(rows)["a"].startswith("add×1")


def _review(review: Any) -> HistoryRow:
    return HistoryRow("i", 1, "r", "done", "approve", 1.0, kind="review",
                      detail={"review": review})


EXPORT = {"name": "m", "initial": "r", "states": [{"name": "r"}, {"name": "done"}],
          "transitions": [{"source": "r", "dest": "done", "trigger": "approve"}]}


def test_a_review_its_sla_timer_decided_is_an_exit() -> None:
    cov = collect(EXPORT, [[_review({"by": "sla-timer"})], [_review({"by": "ann"})]])
    assert cov.exits == {("r", "review_timeout"): 1}


@pytest.mark.parametrize("junk", JUNK)
def test_a_review_of_junk_is_no_exit(junk: Any) -> None:
    cov = collect(EXPORT, [[_review(junk)], [HistoryRow("i", 1, "r", "done", "approve", 1.0,
                                                        kind="review", detail=junk)]])
    assert cov.exits == {}
