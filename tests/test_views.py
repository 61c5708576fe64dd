"""The read side's small formatters (``fsm_engine.views``)."""

from fsm_engine.views import age, when


def test_age_of_a_past_time_counts_back() -> None:
    assert age(1000.0, now=1000.5) == "just now"
    assert age(1000.0, now=1042.0) == "42 s ago"
    assert age(1000.0, now=1000.0 + 3 * 3600) == "3 h ago"


def test_age_of_a_future_time_counts_forward() -> None:
    # a review's due time, a retry's next attempt: a day ahead is not "just now"
    assert age(1000.0 + 86400, now=1000.0) == "in 1 d"
    assert age(1000.0 + 300, now=1000.0) == "in 5 min"
    assert age(1000.0 + 42, now=1000.0) == "in 42 s"
    assert age(1000.3, now=1000.0) == "just now"
    assert when(1000.0 + 7200, now=1000.0).endswith("(in 2 h)")


def test_a_waiting_instance_shows_its_due_time_after_its_reason() -> None:
    """``fsm list`` and the viewer's reason column (issue 38): a timer's or an SLA's due time
    of a waiting instance; a scheduled one's due time; nothing for the others."""
    from fsm_engine.testing.contract import record
    from fsm_engine.views import shown_reason
    rec = record("w")
    rec.status, rec.reason, rec.next_attempt_at = "waiting", "children", 1300.0
    assert shown_reason(rec, now=1000.0).startswith("children · due ")
    assert shown_reason(rec, now=1000.0).endswith("(in 5 min)")
    rec.reason = None
    assert shown_reason(rec, now=1000.0).startswith("due ")
    rec.next_attempt_at = None
    assert shown_reason(rec, now=1000.0) == ""
    rec.status, rec.next_attempt_at = "scheduled", 1042.0
    assert shown_reason(rec, now=1000.0).endswith("(in 42 s)")
    rec.status, rec.reason, rec.next_attempt_at = "running", "retrying", 1060.0
    assert shown_reason(rec, now=1000.0) == "retrying"
