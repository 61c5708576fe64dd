"""The agent journal's text tool turns as the OpenAI tool-calling protocol's native messages
(``llm.tool_transcript``): exact turns translated, anything else kept as it is."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest

from fsm_engine.llm.tool_transcript import RESULTS_PREFIX, native_messages, tool_calls_text, wire_id

HEAD = [{"role": "system", "content": "Answer."}, {"role": "user", "content": '{"q": 1}'}]


def _native(*calls: tuple[str, str]) -> SimpleNamespace:
    """An SDK reply message with native ``tool_calls``."""
    return SimpleNamespace(content=None, tool_calls=[
        SimpleNamespace(function=SimpleNamespace(name=name, arguments=args))
        for name, args in calls])


def _reply(*calls: tuple[str, str]) -> dict[str, str]:
    text = tool_calls_text(_native(*calls))
    assert text is not None
    return {"role": "assistant", "content": text}


def _results(*results: dict[str, Any]) -> dict[str, str]:
    return {"role": "user",
            "content": RESULTS_PREFIX + json.dumps(list(results), sort_keys=True)}


def test_a_turn_of_two_calls_becomes_the_native_pair() -> None:
    msgs = [*HEAD, _reply(("add", '{"a": 1, "b": 2}'), ("boom", "")),
            _results({"call": "1.1", "tool": "add", "result": 3},
                     {"call": "1.2", "tool": "boom", "error": "RuntimeError: fire"})]
    before = copy.deepcopy(msgs)
    out = native_messages(msgs)
    assert msgs == before  # the journal's messages are not touched
    assert out[:2] == HEAD
    assert out[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": wire_id("1.1"), "type": "function", "function": {"name": "add",
                                                      "arguments": '{"a": 1, "b": 2}'}},
        {"id": wire_id("1.2"), "type": "function", "function": {"name": "boom", "arguments": "{}"}}]}
    assert out[3:] == [
        {"role": "tool", "tool_call_id": wire_id("1.1"), "content": '{"result": 3}'},
        {"role": "tool", "tool_call_id": wire_id("1.2"), "content": '{"error": "RuntimeError: fire"}'}]


def test_arguments_that_were_not_json_go_back_as_their_text() -> None:
    out = native_messages([_reply(("add", "a=1")), _results({"call": "1.1", "tool": "add",
                                                             "error": "invalid"})])
    assert out[0]["tool_calls"][0]["function"]["arguments"] == "a=1"


def test_each_turn_of_a_conversation_is_translated_in_place() -> None:
    turn = [_reply(("echo", '{"text": "x"}')), _results({"call": "1.1", "tool": "echo",
                                                         "result": "x"})]
    errored = [{"role": "assistant", "content": "oops"},
               _results({"error": "unreadable reply"})]
    out = native_messages([*HEAD, *turn, *errored, *turn])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "assistant",
                                        "user", "assistant", "tool"]
    assert out[4:6] == errored


ADD = _reply(("add", '{"a": 1, "b": 2}'))
DONE = {"call": "1.1", "tool": "add", "result": 3}


@pytest.mark.parametrize("msgs", [
    pytest.param([ADD, _results({"error": "unreadable reply"})], id="errored-turn"),
    pytest.param([ADD, _results(DONE, {**DONE, "call": "1.2"})], id="more-results"),
    pytest.param([_reply(("add", "{}"), ("add", "{}")), _results(DONE)], id="fewer-results"),
    pytest.param([ADD, _results({**DONE, "tool": "echo"})], id="other-tool"),
    pytest.param([ADD, _results({"tool": "add", "result": 3})], id="no-call-id"),
    pytest.param([ADD, _results({**DONE, "error": "x"})], id="result-and-error"),
    pytest.param([ADD, _results()], id="no-results"),
    pytest.param([ADD, {"role": "user", "content": RESULTS_PREFIX + "[{"}], id="bad-json"),
    pytest.param([ADD, {"role": "user", "content": "Results: []"}], id="other-prefix"),
    pytest.param([ADD], id="no-results-message"),
    pytest.param([{"role": "assistant", "content": "not json"}, _results(DONE)], id="garbage"),
    pytest.param([{"role": "assistant", "content": ADD["content"][:-3]}, _results(DONE)],
                 id="cut-reply"),
    pytest.param([{"role": "assistant", "content": json.dumps(
        {"tool_calls": [{"name": "add", "arguments": {}}]}, indent=1)}, _results(DONE)],
                 id="not-the-providers-text"),
    pytest.param([{"role": "assistant", "content": '{"tool": "add", "arguments": {}}'},
                  _results(DONE)], id="single-call-form"),
    pytest.param([{"role": "assistant", "content": '{"tool_calls": []}'}, _results()],
                 id="no-calls"),
    pytest.param([{"role": "assistant", "content": '{"tool_calls": [{"name": 1, '
                   '"arguments": {}}]}'}, _results(DONE)], id="name-not-text"),
    pytest.param([{"role": "user", "content": ADD["content"]}, _results(DONE)],
                 id="not-the-assistant"),
    pytest.param([{"role": "assistant", "content": "[1]"}, {"role": "user", "content": "7"}],
                 id="lists"),
])
def test_anything_not_exactly_a_tool_turn_stays_text(msgs: list[dict[str, str]]) -> None:
    assert native_messages([*HEAD, *msgs]) == [*HEAD, *msgs]


def test_no_native_calls_is_no_text() -> None:
    assert tool_calls_text(SimpleNamespace(content="hi", tool_calls=None)) is None
    assert native_messages([]) == []


def test_wire_ids_are_nine_letters_or_digits_the_same_on_every_turn() -> None:
    ids = [wire_id(f"{turn}.{n}") for turn in range(1, 40) for n in range(1, 6)]
    assert all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids)  # Mistral's rule
    assert len(set(ids)) == len(ids) and wire_id("1.1") == ids[0]
