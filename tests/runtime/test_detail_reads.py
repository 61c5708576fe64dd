"""Stored history ``detail`` read back (issue 37): a timer's recorded due times, and the
one-line notes of agent journal rows, read what fits and never raise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fsm_engine.runtime.kinds import timers
from fsm_engine.store.records import HistoryRow
from fsm_engine.testing.contract_fixtures import record
from fsm_engine.views import agent_note, timer_json

JUNK = [None, "x", [1], {"a": [1]}, True, 10**400, []]


def _row(detail: Any, source: str = "wait") -> HistoryRow:
    return HistoryRow("w", 2, source, "wait", "go", 900.0, detail=detail)


def _waiting() -> Any:
    rec = record("w", state="wait", status="waiting")
    rec.next_attempt_at = None
    return rec


class _Store:
    def __init__(self, rows: list[HistoryRow]) -> None:
        self.rows = rows

    def history(self, iid: str) -> list[HistoryRow]:
        return self.rows


#: A machine whose state ``wait`` has timers ``t1`` and ``t2`` (due 60 s and 120 s after).
CM: Any = SimpleNamespace(timers={"wait": [("t1", 60.0), ("t2", 120.0)]})


def test_recorded_due_times_read_back_the_numbers_only() -> None:
    row = _row({"timers": {"t1": 1000, "t2": "soon", "gone": 5.0, "t3": True}}, "start")
    assert timer_json(_waiting(), [row]) == {"trigger": "gone", "due": 5.0,
                                            "timers": {"t1": 1000.0, "gone": 5.0}}
    rec = _waiting()
    rec.visits = {"wait": 1}
    assert timers.recorded(CM, _Store([row]), rec) == {"t1": 1000.0}  # (its timers only)


@pytest.mark.parametrize("junk", JUNK)
def test_recorded_due_times_of_junk_are_none(junk: Any) -> None:
    rows = [_row({"timers": junk}, "start")]
    assert timer_json(_waiting(), rows) is None
    assert timer_json(_waiting(), [_row({"timers": {"t1": junk}}, "start")]) is None
    rec = _waiting()  # none recorded: they fall from the entering row's time
    assert timers.recorded(CM, _Store(rows), rec) == {"t1": 960.0, "t2": 1020.0}


def test_an_agents_rows_read_as_one_line_each() -> None:
    turn = {"agent": "turn", "turn": 2, "calls": [{"tool": "add", "arguments": {"a": 2}}, 5]}
    assert agent_note(turn) == 'turn 2: add {"a": 2}'
    decision = {"agent": "decision", "choice": "approve", "call": "2.1", "review": {"by": "ann"}}
    assert agent_note(decision) == "approve 2.1 by ann"
    assert agent_note({"agent": "call", "call": "1.1", "tool": "add", "result": 5}) == \
        "call 1.1 add → 5"


@pytest.mark.parametrize("junk", JUNK)
def test_an_agents_rows_of_junk_read_as_no_call_and_no_one(junk: Any) -> None:
    assert agent_note({"agent": "turn", "turn": 1, "calls": junk}) == "turn 1: no call"
    assert agent_note({"agent": "decision", "choice": "deny", "call": "1.1",
                       "review": junk}) == "deny 1.1 by None"
    assert agent_note({"agent": junk}) is None


def _llm_row(calls: Any) -> HistoryRow:
    return HistoryRow("w", 3, "a", "b", "go", 900.0, detail={"llm_calls": calls})


def test_recorded_replies_read_the_calls_that_fit() -> None:
    from fsm_engine.runtime.reply_cache import RecordedReplies
    calls = [{"key": "k1", "reply": "hi", "model": "p:m"}, 5, "x", {"key": "k2", "reply": 3},
             {"key": ["k3"], "reply": "no"}, {"key": "k4", "reply": "err", "error": "boom"},
             {"key": "k5", "reply": "ok", "finish_reason": "length"}]
    got = RecordedReplies(_Store([_llm_row(calls)]), "w")  # type: ignore[arg-type]
    hit = got.get("k1")
    assert hit is not None and (hit.text, hit.model, hit.finish_reason) == ("hi", "m", "stop")
    assert [got.get(k) is None for k in ("k2", "k3", "k4")] == [True] * 3
    assert got.get("k5").finish_reason == "length"  # type: ignore[union-attr]


@pytest.mark.parametrize("junk", JUNK)
def test_recorded_replies_of_junk_are_none(junk: Any) -> None:
    from fsm_engine.runtime.reply_cache import RecordedReplies
    rows = [_llm_row(junk), _llm_row([junk]), HistoryRow("w", 4, "a", "b", "go", 1.0,
                                                         detail=junk)]
    if not isinstance(junk, str):  # (text is a reply)
        rows.append(_llm_row([{"key": "k", "reply": junk}]))
    assert RecordedReplies(_Store(rows), "w").get("k") is None  # type: ignore[arg-type]


def test_inline_stream_rows_stand_for_the_marked_calls_that_fit() -> None:
    from fsm_engine.runtime import stream_inline
    calls = [{"reply": "hello", "finish_reason": "stop", "stream": {"json": True}},
             {"reply": "unmarked"}, 7, {"reply": 5, "stream": {"json": False}},
             {"reply": "x", "stream": "yes"}]
    rows = stream_inline.rows(_llm_row(calls), [], 0)
    assert [(r.kind, r.attempt, r.text, r.info) for r in rows] == [
        ("open", 1, "", {"json": True}), ("chunk", 1, "hello", {}),
        ("end", 1, "", {"finish": "stop", "chars": 5}),
        ("superseded", 1, "", {"by": [3, 2]}), ("open", 2, "", {}),
        ("end", 2, "", {"finish": None, "chars": 0})]


@pytest.mark.parametrize("junk", JUNK)
def test_inline_stream_rows_of_junk_are_none(junk: Any) -> None:
    from fsm_engine.runtime import stream_inline
    rows = [_llm_row(junk), _llm_row([junk]), HistoryRow("w", 4, "a", "b", "go", 1.0,
                                                         detail=junk)]
    if not isinstance(junk, dict):  # (an object marks it: its rows, of no text)
        rows.append(_llm_row([{"reply": "r", "stream": junk}]))
    assert [stream_inline.rows(row, [], 0) for row in rows] == [[]] * len(rows)


def _rebuilt() -> Any:
    from fsm_engine.runtime.kinds.replay import Rebuilt
    return Rebuilt({}, "a", {"a": 1}, [
        SimpleNamespace(state="a", visit=1, tokens=7, at=1.0)])  # type: ignore[list-item]


def test_a_rebuild_counts_the_reasks_and_attempts_rows_recorded() -> None:
    cm: Any = SimpleNamespace(states={"a": SimpleNamespace(name="a", agent=None,
                                                           token_budget=None)})
    r = _rebuilt()
    h = HistoryRow("w", 1, "a", "b", "go", 5.0, detail={"reasks": 2, "attempt": 2})
    assert r.run(record("w"), cm, h).state_tokens_used == 7  # its failed attempt's
    r.after(h)
    assert r.loops == 3


@pytest.mark.parametrize("junk", [*JUNK, "3", 2.5])
def test_a_rebuild_counts_junk_as_none_recorded(junk: Any) -> None:
    """(A count that is text or a fraction is none: ``"3"`` once read as 3, ``2.5`` as 2
    and ``null`` raised ``TypeError``.)"""
    cm: Any = SimpleNamespace(states={"a": SimpleNamespace(name="a", agent=None,
                                                           token_budget=None)})
    for detail in ({"reasks": junk, "attempt": junk}, junk):
        r = _rebuilt()
        h = HistoryRow("w", 1, "a", "b", "go", 5.0, detail=detail)
        assert r.run(record("w"), cm, h).state_tokens_used == 0
        r.after(h)
        assert r.loops == 1
