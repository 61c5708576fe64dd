"""Scripted model replies for the agent-state tests (issue 23): a turn calling tools,
a final answer, the issue's 3-turn, 4-call ``LOOP`` and that loop ``KEYED`` by prompt."""

from __future__ import annotations

import json
from typing import Any


def calls(*pairs: tuple[str, dict[str, Any]], tokens: int = 10) -> dict[str, Any]:
    """A scripted turn calling ``(tool, arguments)`` pairs."""
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in pairs],
            "prompt_tokens": tokens, "completion_tokens": tokens}


def final(answer: str, tokens: int = 10) -> dict[str, Any]:
    return {"text": json.dumps({"final": {"answer": answer}}), "prompt_tokens": tokens,
            "completion_tokens": tokens}


#: The 3-turn, 4-call loop of the issue: two calls, then two (one a side effect), then
#: the final answer.
LOOP = [calls(("add", {"a": 2, "b": 3}), ("echo", {"text": "hi"})),
        calls(("echo", {"text": "again"}), ("send_report", {"text": "2+3=5"})),
        final("5")]


#: ``LOOP`` keyed by what each turn's prompt holds, so a resumed process's model answers
#: the turn it is at (a new process's script starts again from its first line).
KEYED = [{**LOOP[2], "match": '"result": "sent"'}, {**LOOP[1], "match": '"result": "hi"'},
         LOOP[0]]
