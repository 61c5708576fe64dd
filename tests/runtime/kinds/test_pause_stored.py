"""A stored pause request is hostile (issue 37): ``pausing.decode`` reads what it can and
gives ``None`` for anything else, never a traceback; format 12's rows likewise."""

from __future__ import annotations

import json

import pytest

from fsm_engine.runtime.kinds import pausing
from fsm_engine.store import pause_rows

GOOD = {"by": "ann", "reason": "hold", "at": 5.0, "base": 2, "version": 3}


def _with(**changes: object) -> str:
    return json.dumps({**GOOD, **changes})


def test_a_stored_request_round_trips_and_extra_keys_are_ignored() -> None:
    req = pausing.PauseRequest("ann", "hold", 5.0, 2, 3, True)
    assert pausing.decode(pausing.encode(req)) == req
    assert pausing.decode(_with(extra=[1, {"x": 2}])) == pausing.PauseRequest(
        "ann", "hold", 5.0, 2, 3)


@pytest.mark.parametrize("text", [
    None, "", "not json", "[]", "3", '"text"', "null",
    _with(by=7), _with(reason=None), _with(reason={"a": 1}), _with(at="5"),
    _with(at=None), _with(version=3.0), _with(version=True), _with(base="2"),
    _with(base=None), json.dumps({"by": "ann"}), _with(at=10**400),
    _with(at=float("inf")), _with(at=float("nan")),
])
def test_a_value_that_is_not_a_request_is_none(text: str | None) -> None:
    assert pausing.decode(text) is None


def test_long_text_is_cut_and_only_true_withdraws() -> None:
    req = pausing.decode(_with(by="b" * 999, reason="r" * 999, withdrawn="yes", at=7))
    assert req == pausing.PauseRequest("b" * 200, "r" * 200, 7.0, 2, 3, False)
    assert isinstance(req.at, float)
    assert pausing.decode(_with(by=None, withdrawn=True)) == pausing.PauseRequest(
        None, "hold", 5.0, 2, 3, True)


def test_a_format_12_row_converts_when_its_version_is_an_int() -> None:
    old = json.dumps({"by": "ann", "reason": "hold", "at": 5.0, "version": 3,
                      "prior_reason": "rate_limited", "withdrawn": True, "junk": [1]})
    new, prior = pause_rows.converted(old) or ("", None)
    assert (json.loads(new), prior) == ({"by": "ann", "reason": "hold", "at": 5.0, "base": 2,
                                         "version": 3, "withdrawn": True}, "rate_limited")
    assert pause_rows.converted(json.dumps({"version": 1, "prior_reason": 5})) == (
        json.dumps({"by": None, "reason": None, "at": None, "base": 0, "version": 1,
                    "withdrawn": False}), None)


@pytest.mark.parametrize("text", [None, "", "{", "[]", "1", '{"version": "3"}',
                                  '{"version": true}', '{"version": 3.0}', '{"by": "x"}'])
def test_a_format_12_row_that_is_not_a_request_is_dropped(text: str | None) -> None:
    assert pause_rows.converted(text) is None
