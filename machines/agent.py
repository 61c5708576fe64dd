"""An agent state: answer a question about the license texts in /usr/share/common-licenses.

One state, ``research``, runs a tool-calling loop (``fsm_engine.definition.agent``): the
model lists the files, greps them and reads parts of them until it can answer; each model
turn and each tool call is a durable step (a history row of kind ``tool``), bounded by
``max_turns`` and the token budget.  ``send_report`` is a side effect (through the
outbox, under the key ``instance:state:visit:turn:call``) that a person must approve
(``fsm review decide ITEM approve|reject [--edit args.json]``).

Input: ``{"question": "…"}`` (``fsm run machines/agent.py --input q.json``); output: the
context field ``answer``.  Runs on the embedded model by default (``--llm`` to change it);
for a small model the reply is decoded under a JSON-schema union of the tool calls and
the final answer, so every reply is a valid call.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel, Field

from fsm_engine import Agent, Machine, State, ToolCall, Transition, tool
from fsm_engine.sinks import deliver

ROOT = Path(os.environ.get("FSM_LICENSES", "/usr/share/common-licenses"))
#: Characters ``read_file`` returns at most per call.
READ_LIMIT = 1200
#: Matches ``grep`` returns at most.
GREP_LIMIT = 12


class Question(BaseModel):
    """Instance context: the question and, once answered, the answer."""

    question: str = Field(max_length=2000)
    answer: str = ""


class Answer(BaseModel):
    """The final output (applied to the context; no length bound: a bound becomes a
    grammar repetition the embedded model's constrained decoding pays for)."""

    answer: str


def _files() -> list[Path]:
    return sorted(p for p in ROOT.iterdir() if p.is_file() and not p.is_symlink()) \
        if ROOT.is_dir() else []


def _resolve(name: str) -> Path:
    """The license file called ``name`` (no paths: only names ``list_files`` shows)."""
    found = {p.name: p for p in _files()}
    if name not in found:
        raise ValueError(f"no license file {name!r}; call list_files for the names")
    return found[name]


def list_files() -> list[str]:
    """List the names of the license files."""
    return [p.name for p in _files()]


def read_file(name: str, offset: int = 0) -> dict[str, object]:
    """Read up to 1200 characters of the license file `name`, starting at `offset`."""
    text = _resolve(name).read_text(encoding="utf-8", errors="replace")
    offset = max(0, offset)
    return {"name": name, "offset": offset, "text": text[offset:offset + READ_LIMIT],
            "length": len(text)}


def grep(pattern: str) -> list[dict[str, str]]:
    """Find lines containing `pattern` (case-insensitive) in the license files; at most 12."""
    needle = re.compile(re.escape(pattern[:100]), re.IGNORECASE)
    hits: list[dict[str, str]] = []
    for path in _files():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if needle.search(line):
                hits.append({"file": path.name, "line": line.strip()[:100]})
                break  # one line per file: the files that mention it
        if len(hits) >= GREP_LIMIT:
            break
    return hits


@tool(side_effect=True)
def send_report(text: str, call: ToolCall) -> dict[str, object]:
    """Send a short report of the findings to the licensing team."""
    return deliver({"report": text[:2000]}, call.idempotency_key)


machine = Machine(
    name="agent",
    description="Answer a question about the license texts with tools.",
    context=Question, initial="research", max_transitions=20, token_budget=24000,
    states=[
        State("research", agent=Agent(
            tools=[list_files, read_file, grep, send_report], output=Answer, max_turns=6,
            approve=["send_report"], max_tokens=200, max_result_chars=1600, min_calls=1,
            instructions="You answer questions about software license texts. Use the "
                         "tools to look at the files, then give the final answer: name "
                         "the licenses.")),
        State("answered", final=True),
        State("gave_up", final=True, failure=True,
              description="no answer within max_turns or the token budget"),
        State("rejected", final=True, description="a reviewer refused a report"),
    ],
    transitions=[
        Transition("done", "research", "answered"),
        Transition("turns_exhausted", "research", "gave_up"),
        Transition("budget_exhausted", "research", "gave_up"),
        Transition("rejected", "research", "rejected"),
    ],
)


def _calls(*calls: tuple[str, dict[str, object]]) -> dict[str, object]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls],
            "prompt_tokens": 300, "completion_tokens": 20}


_GREP = _calls(("grep", {"pattern": "copyleft"}))
_REPORT = _calls(("send_report", {"text": "Copyleft: GPL, LGPL, MPL, GFDL."}))
_ANSWER = {"text": '{"final": {"answer": "GPL-2, GPL-3, LGPL, MPL, GFDL"}}',
           "prompt_tokens": 400, "completion_tokens": 15}
_QUESTION = {"question": "which of these licenses are copyleft?"}

#: The machine's own cases (``fsm test machines/agent.py``), on the virtual clock.
CASES = [
    {"name": "greps, then answers", "input": _QUESTION, "replies": [_GREP, _ANSWER],
     "path": ["research", "answered"], "output": {"answer": "GPL-2, GPL-3, LGPL, MPL, GFDL"}},
    {"name": "a report a person approves", "input": _QUESTION,
     "replies": [_GREP, _REPORT, _ANSWER], "decisions": [{"choice": "approve", "by": "ann"}],
     "path": ["research", "answered"]},
    {"name": "a report a person rejects", "input": _QUESTION, "replies": [_GREP, _REPORT],
     "decisions": [{"choice": "reject", "by": "ann"}], "path": ["research", "rejected"]},
    {"name": "never answers: max_turns", "input": _QUESTION, "replies": [_GREP],
     "path": ["research", "gave_up"], "status": "failed"},
    {"name": "no budget for the first turn", "input": _QUESTION, "token_budget": 50,
     "moves": [["research", "budget_exhausted", "gave_up"]], "status": "failed"},
]
