"""A pause row's stored ``detail`` is hostile (issue 37): unpausing, a paused delayed
start's due time, a restart's due time and the operator's note read what fits, field by
field, and never raise."""

from __future__ import annotations

from typing import Any

import pytest

from fsm_engine.runtime import outcome
from fsm_engine.runtime.start_options import rescheduled
from fsm_engine.store.records import HistoryRow, StepCommit
from fsm_engine.testing.contract_fixtures import record
from fsm_engine.views import pause_note

NOW = 2000.0
JUNK = [None, "x", [1], {"a": 1}, True, 10**400]


def _pause(**detail: Any) -> HistoryRow:
    return HistoryRow("p", 3, "start", "start", "pause", 1000.0, kind="pause", detail=detail)


def _unpaused(**detail: Any) -> Any:
    rec = record("p", status="paused")
    rec.attempt = 3
    return outcome.unpaused(rec, _pause(**detail), NOW, by="bob").record


def test_unpausing_restores_what_the_pause_row_kept() -> None:
    new = _unpaused(operator="ann", status="waiting", reason="review", timer_left_s=5,
                    deadline_left_s=7.5)
    assert (new.status, new.reason, new.next_attempt_at, new.deadline, new.attempt) == (
        "waiting", "review", NOW + 5, NOW + 7.5, 3)


@pytest.mark.parametrize("junk", JUNK)
def test_unpausing_a_row_of_junk_runs_it_again_with_no_timer(junk: Any) -> None:
    """(A bool is no number of seconds, and a number past a float's range is none: once
    ``true`` read as 1 s and 10**400 raised ``OverflowError``.)"""
    new = _unpaused(operator="ann", status=junk, reason=junk if junk != "x" else 5,
                    timer_left_s=junk, deadline_left_s=junk)
    assert (new.status, new.reason, new.next_attempt_at, new.deadline, new.attempt) == (
        "running", None, None, None, 3)


def test_a_policy_pause_starts_its_retries_over() -> None:
    new = _unpaused(operator=None, status="pending", timer_left_s=5)
    assert (new.status, new.attempt, new.next_attempt_at) == ("pending", 1, None)


def test_a_paused_delayed_starts_due_time_reads_what_fits() -> None:
    assert outcome.scheduled_due(_pause(status="scheduled", scheduled_due=1500)) == 1500.0
    assert outcome.scheduled_due(_pause(status="scheduled", scheduled_due="x",
                                        timer_left_s=20)) == 1020.0
    assert outcome.scheduled_due(_pause(status="waiting", scheduled_due=1500)) is None
    assert outcome.scheduled_due(None) is None


@pytest.mark.parametrize("junk", JUNK)
def test_a_paused_delayed_starts_due_time_of_junk_is_none(junk: Any) -> None:
    assert outcome.scheduled_due(_pause(status="scheduled", scheduled_due=junk,
                                        timer_left_s=junk)) is None


@pytest.mark.parametrize("junk", [*JUNK, NOW - 1])
def test_a_restart_whose_cancel_kept_no_usable_due_time_runs_at_once(junk: Any) -> None:
    cancel = HistoryRow("p", 4, "start", "start", "cancel", 1000.0, kind="cancel",
                        detail={"scheduled_due": junk})
    step = StepCommit(record("p"), 4)
    assert rescheduled(None, step, cancel, NOW) is step  # type: ignore[arg-type]
    assert step.record.status == "pending"


def test_the_pause_and_unpause_notes_read_what_fits() -> None:
    assert pause_note({"kind": "pause", "detail": {"operator": "ann"}, "reason": "audit"}) \
        == "paused by ann: audit"
    assert pause_note({"kind": "unpause", "detail": {"operator": "bob", "paused_s": 12.5}}) \
        == "unpaused by bob after 12.5 s"


@pytest.mark.parametrize("junk", [j for j in JUNK if j != "x"])
def test_the_notes_of_junk_rows_name_no_one(junk: Any) -> None:
    """(A bool is no number: ``paused_s`` of ``true`` once read as 1 s.)"""
    for detail in (junk, [], 3, "text"):
        assert pause_note({"kind": "pause", "detail": detail, "reason": "audit"}) == \
            "paused by its policy: audit"
    assert pause_note({"kind": "pause", "detail": {"operator": junk}}) == \
        "paused by its policy: paused"
    assert pause_note({"kind": "unpause", "detail": {"operator": junk, "paused_s": junk}}) \
        == "unpaused"
