"""An agent state's tool transcript in the text protocol and in the OpenAI tool-calling
protocol's native form (pure, no I/O).

The agent journal (``runtime.kinds.agent_journal``) replays each model turn as two
messages of text, whatever the provider — these are what reply keys hash, so they never
change::

    {"role": "assistant", "content": '{"tool_calls": [{"name": "add", "arguments": {...}}]}'}
    {"role": "user", "content": 'Tool results: [{"call": "1.1", "result": 42, "tool": "add"}]'}

A provider that sends ``tools=`` natively (``OpenAICompatible``) sends such a pair, for the
request body only, as the protocol's own (:func:`native_messages`)::

    {"role": "assistant", "content": None, "tool_calls": [{"id": wire_id("1.1"),
        "type": "function", "function": {"name": "add", "arguments": '{...}'}}]}
    {"role": "tool", "tool_call_id": wire_id("1.1"), "content": '{"result": 42}'}
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fsm_engine import json_input
from fsm_engine.errors import InvalidInput

__all__ = ["RESULTS_PREFIX", "tool_calls_text", "calls_text", "native_messages", "wire_id"]

#: How the user message holding a turn's tool results begins (then their JSON list).
RESULTS_PREFIX = "Tool results: "


def tool_calls_text(message: Any) -> str | None:
    """A reply's native ``tool_calls`` (an SDK message object) as the text
    ``{"tool_calls": [{"name", "arguments"}]}`` (arguments that are not JSON kept as their
    text); ``None`` without any."""
    calls = getattr(message, "tool_calls", None) or []
    pairs = [(str(getattr(fn, "name", "")), getattr(fn, "arguments", None) or "{}")
             for fn in (getattr(call, "function", None) for call in calls)]
    return calls_text(pairs) if pairs else None


def calls_text(calls: list[tuple[str, str]]) -> str:
    """``(name, arguments as JSON text)`` pairs as the text ``{"tool_calls": [{"name",
    "arguments"}]}``: each call's arguments parsed (depth-checked, ``json_input``) and kept
    as that value, or as their text when they are not JSON (or nest too deep to read).
    ``tool_calls_text`` of a reply, and a streamed reply's calls (``llm.tool_deltas``)."""
    out = []
    for name, raw in calls:
        args = _loads(raw)
        if args is _NOT_JSON:  # not JSON, or nested too deep to read: kept as its text
            args = raw
        out.append({"name": name, "arguments": args})
    return _dump(out)


#: What ``_loads`` returns for text that is not JSON.
_NOT_JSON: Any = object()


def _loads(text: str) -> Any:
    """``text``'s JSON value, depth-checked (a model's text may nest 5,000 deep);
    ``_NOT_JSON`` when it is not JSON or nests deeper than ``json_input.MAX_DEPTH``."""
    try:
        return json_input.parse(text, "tool transcript")
    except InvalidInput:
        return _NOT_JSON


def _dump(calls: list[dict[str, Any]]) -> str:
    return json.dumps({"tool_calls": calls}, ensure_ascii=False)


def native_messages(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """``messages`` with each text tool turn (an assistant message that is exactly
    :func:`tool_calls_text`'s text, then a user message of :data:`RESULTS_PREFIX` and one
    result per call, in order, each with its ``call`` id) as the native pair: an assistant
    message with ``tool_calls`` and one ``role: tool`` message per call.  Everything else
    (an errored turn, counts that differ, unreadable text) is kept as it is; never raises.
    A new list; the messages given are not changed."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        pair = _native_pair(messages[i], messages[i + 1]) if i + 1 < len(messages) else None
        if pair is None:
            out.append(messages[i])
            i += 1
        else:
            out.extend(pair)
            i += 2
    return out


def _native_pair(reply: dict[str, str], results: dict[str, str]) -> list[dict[str, Any]] | None:
    """The native messages of one text tool turn (``None``: not one, exactly)."""
    calls = _calls(reply)
    done = _results(results)
    if calls is None or done is None or len(calls) != len(done):
        return None
    if any(r.get("tool") != c["name"] for c, r in zip(calls, done, strict=True)):
        return None
    asked = [{"id": wire_id(r["call"]), "type": "function",
              "function": {"name": c["name"], "arguments": _arguments(c["arguments"])}}
             for c, r in zip(calls, done, strict=True)]
    answers = [{"role": "tool", "tool_call_id": wire_id(r["call"]),
                "content": json.dumps({k: v for k, v in r.items() if k not in ("call", "tool")},
                                      ensure_ascii=False, sort_keys=True)} for r in done]
    return [{"role": "assistant", "content": None, "tool_calls": asked}, *answers]


_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def wire_id(call_id: str) -> str:
    """The id a journal call (``"1.1"``) goes out under: 9 letters and digits from its
    SHA-256, the same on every turn — the strictest form servers ask (Mistral's, 9
    alphanumerics; OpenAI's and llama.cpp's take any string)."""
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, d = divmod(n, 62)
        out.append(_ALPHABET[d])
    return "".join(out)


def _calls(message: dict[str, str]) -> list[dict[str, Any]] | None:
    """The calls of an assistant message that is exactly :func:`tool_calls_text`'s text."""
    text = message.get("content")
    if message.get("role") != "assistant" or not isinstance(text, str):
        return None
    data = _loads(text)
    calls = data.get("tool_calls") if isinstance(data, dict) and len(data) == 1 else None
    if not isinstance(calls, list) or not calls:
        return None
    if not all(isinstance(c, dict) and set(c) == {"name", "arguments"}
               and isinstance(c["name"], str) for c in calls):
        return None
    return calls if _dump(calls) == text else None


def _results(message: dict[str, str]) -> list[dict[str, Any]] | None:
    """The results of a user message of :data:`RESULTS_PREFIX`, each with a ``call`` id
    and a ``result`` or an ``error``."""
    text = message.get("content")
    if message.get("role") != "user" or not isinstance(text, str) \
            or not text.startswith(RESULTS_PREFIX):
        return None
    data = _loads(text[len(RESULTS_PREFIX):])
    if not isinstance(data, list) or not all(
            isinstance(r, dict) and isinstance(r.get("call"), str)
            and len({"result", "error"} & set(r)) == 1 for r in data):
        return None
    return data


def _arguments(args: Any) -> str:
    """A call's ``arguments`` as the protocol's JSON string (text kept as it came)."""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
