"""Streamed tool calls put together from a server's ``delta.tool_calls`` fragments (issue 36):
the text subscribers read as they come, the reply ``complete()`` would make of the same
calls, and hostile shapes (a server is a peer nobody vetted)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic_core import from_json

from fsm_engine.errors import ServerError
from fsm_engine.llm.sse import SseEvents
from fsm_engine.llm.tool_deltas import MAX_CALLS, ToolDeltas
from fsm_engine.llm.tool_transcript import tool_calls_text


def _delta(index: Any, name: str | None = None, args: str | None = None,
           call_id: str | None = None) -> dict[str, Any]:
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    out: dict[str, Any] = {"index": index, "function": fn}
    if call_id is not None:
        out["id"] = call_id
    return out


def _complete_text(*calls: tuple[str, str]) -> str | None:
    """What ``complete()`` makes of the same calls (``tool_calls_text`` of the message)."""
    return tool_calls_text(SimpleNamespace(tool_calls=[
        SimpleNamespace(function=SimpleNamespace(name=n, arguments=a)) for n, a in calls]))


def _feed(deltas: list[dict[str, Any]], after_text: bool = False) -> tuple[list[str], ToolDeltas]:
    tools = ToolDeltas("server")
    shown = [tools.take([d], after_text) for d in deltas]
    return [*shown, tools.close()], tools


def test_fragments_show_as_the_protocols_text_and_the_reply_is_completes() -> None:
    shown, tools = _feed([_delta(0, "add", "", "call_1"), _delta(0, args='{"a":'),
                          _delta(0, args="2}"), _delta(1, "echo", "", "call_2"),
                          _delta(1, args='{"text": "é"}')])
    text = "".join(shown)
    assert text == ('{"tool_calls": [{"name": "add", "arguments": {"a":2}}, '
                    '{"name": "echo", "arguments": {"text": "é"}}]}')
    assert tools.text() == _complete_text(("add", '{"a":2}'), ("echo", '{"text": "é"}'))
    assert json.loads(tools.text() or "") == json.loads(text)
    for n in range(1, len(shown)):  # every prefix reads as the calls so far
        from_json("".join(shown[:n]), allow_partial=True)


def test_a_call_without_arguments_and_text_before_the_calls() -> None:
    shown, tools = _feed([_delta(0, "now")], after_text=True)
    assert "".join(shown) == '\n{"tool_calls": [{"name": "now", "arguments": {}}]}'
    assert tools.text() == _complete_text(("now", "{}"))


def test_arguments_that_are_not_json_or_nest_too_deep_are_kept_as_text() -> None:
    deep = "[" * 5000 + "]" * 5000
    _, tools = _feed([_delta(0, "add", "{not json"), _delta(1, "echo", deep)])
    calls = json.loads(tools.text() or "")["tool_calls"]
    assert calls == [{"name": "add", "arguments": "{not json"},
                     {"name": "echo", "arguments": deep}]
    assert tools.text() == _complete_text(("add", "{not json"), ("echo", deep))


def test_hostile_shapes_are_skipped_and_the_calls_are_counted() -> None:
    tools = ToolDeltas("server")
    assert tools.take("calls", False) == "" and tools.take([None, 3, []], False) == ""
    assert tools.take([{"index": 0, "function": {"name": 5, "arguments": ["x"]}}], False) == ""
    assert tools.take([{"index": "0", "function": "add"}], False) == ""
    assert tools.take([_delta(-1, "add", "{}")], False)  # numbered nothing: call 0
    assert tools.text() == _complete_text(("add", "{}"))
    with pytest.raises(ServerError, match=f"more than {MAX_CALLS} tool calls"):
        for n in range(MAX_CALLS + 1):
            tools.take([_delta(10**12 + n, "add", "{}")], False)


def test_a_call_interleaved_after_a_later_one_is_kept_not_shown() -> None:
    shown, tools = _feed([_delta(0, "add", '{"a": '), _delta(1, "echo", '{"text": "x"}'),
                          _delta(0, args="1}")])
    assert shown[2] == ""  # (the shown text is inside call 1 by then)
    assert tools.text() == _complete_text(("add", '{"a": 1}'), ("echo", '{"text": "x"}'))


def test_sse_events_show_calls_and_hide_text_after_them() -> None:
    seen = SseEvents("server")
    events = [{"choices": [{"delta": {"content": "thinking"}}]},
              {"choices": [{"delta": {"tool_calls": [_delta(0, "add", '{"a": 1}')]}}]},
              {"choices": [{"delta": {"content": " more"}}]},
              {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}]
    shown = [seen.line("data: " + json.dumps(e)) for e in events]
    assert shown == ["thinking", '\n{"tool_calls": [{"name": "add", "arguments": {"a": 1}',
                     "", ""]
    assert seen.tools is not None and seen.finish == "tool_calls"
    assert seen.tools.text() == _complete_text(("add", '{"a": 1}'))


def test_a_name_sent_with_every_fragment_is_one_name() -> None:
    """llama.cpp's server repeats ``function.name`` (and ``id``) in every delta of a call."""
    shown, tools = _feed([_delta(0, "add", '{"a": ', "c1"), _delta(0, "add", "1}", "c1"),
                          _delta(1, "ec", "{}"), _delta(1, "echo", "")])
    assert tools.text() == _complete_text(("add", '{"a": 1}'), ("echo", "{}"))
    assert "".join(shown).startswith('{"tool_calls": [{"name": "add", "arguments": {"a": 1}}')
