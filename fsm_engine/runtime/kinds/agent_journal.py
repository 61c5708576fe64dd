"""An agent state's journal: what its history rows of kind ``tool`` say, and the prompts
and commits built from them (pure, no I/O).

Rows of one visit (``detail.agent`` tells which):

- ``turn``: a model turn: ``turn`` (1-based), ``calls`` (``[{"id", "tool", "arguments"}]``
  as the model asked), ``reply`` (its text), ``error`` (an unreadable reply); the row's
  ``tokens`` are the turn's;
- ``call``: a tool call: ``turn``, ``call`` (its id), ``tool``, ``arguments`` (validated,
  as run), ``result`` or ``error``, ``attempts``; the row's ``duration_ms`` is the call's;
- ``ask`` / ``decision``: a call of a tool in ``approve`` put to review, and the
  reviewer's (or the SLA timer's) ``choice`` with the ``arguments`` it approved.

The model's reply protocol (``reply_schema`` constrains it where the provider decodes by
schema; a provider speaking the OpenAI tool-calling protocol gets ``openai_tools`` and
answers calls natively, returned in the ``tool_calls`` form): ``{"tool": NAME,
"arguments": {…}}``, ``{"tool_calls": [{"name": NAME, "arguments": {…}}, …]}`` (several
calls in one turn) or ``{"final": OUTPUT}``.  Each turn is fed back as that reply and a user
message of ``RESULTS_PREFIX`` and the calls' results; that provider sends the pair as native
``tool_calls`` and ``role: tool`` messages, on the wire only (``llm.tool_transcript``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ...llm.tool_transcript import RESULTS_PREFIX
from ...store.records import RUNNING, TOOL, WAITING, HistoryRow, InstanceRecord, StepCommit
from .. import outcome

if TYPE_CHECKING:
    from ...definition.agent import Agent
    from ...store.records import ReviewItem


#: Most characters of one turn's calls (their JSON): the turn row's ``calls`` and each
#: call row's ``arguments`` repeat them, while the reply itself is kept whole once, in
#: the turn's ``llm_calls`` entry (``reply`` keeps its first 4,000 characters).
MAX_CALLS_CHARS = 64_000


@dataclass(slots=True)
class Journal:
    """One visit's rows, in order: turns, the calls done, and approvals."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    asked: dict[str, dict[str, Any]] = field(default_factory=dict)
    decided: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Invalid calls and replies in a row (reset by a call that ran).
    errors_in_row: int = 0
    #: Tokens the visit's journaled turns were billed (against the state's budget).
    tokens: int = 0

    @property
    def calls_made(self) -> int:
        """Calls that reached their tool (not an unknown tool or invalid arguments)."""
        return sum(1 for d in self.done.values() if not d.get("invalid"))

    def pending(self) -> dict[str, Any] | None:
        """The last turn's first call not yet done (``None``: the model's turn)."""
        if not self.turns:
            return None
        return next((c for c in self.turns[-1]["calls"] if c["id"] not in self.done), None)


    def add(self, row: HistoryRow) -> None:
        """Take one journal row of this visit (rows of other kinds are ignored)."""
        d = row.detail
        kind = d.get("agent")
        self.tokens += row.tokens
        if kind == "turn":
            self.turns.append(d)
            self.errors_in_row += 1 if d.get("error") else 0
        elif kind == "call":
            self.done[d["call"]] = d
            self.errors_in_row = self.errors_in_row + 1 if d.get("invalid") else 0
        elif kind == "ask":
            self.asked[d["call"]] = d
        elif kind == "decision":
            self.decided[d["call"]] = d


def read(rows: list[HistoryRow], state: str, visit: int) -> Journal:
    """The journal of ``state``'s ``visit`` from an instance's history rows."""
    j = Journal()
    for row in rows:
        if row.kind == TOOL and row.source == state and row.detail.get("visit") == visit:
            j.add(row)
    return j


# -- the protocol ------------------------------------------------------------------------

@lru_cache(maxsize=256)
def reply_schema(agent: Agent, final: bool = True) -> dict[str, Any]:
    """The JSON-schema union of one reply: a call of one of the tools, or (``final``) the
    final output."""
    calls = [{"type": "object", "required": ["tool", "arguments"], "additionalProperties": False,
              "properties": {"tool": {"const": t.name}, "arguments": t.schema()}}
             for t in agent.by_name.values()]
    answer = {"type": "object", "required": ["final"], "additionalProperties": False,
              "properties": {"final": agent.output.model_json_schema()}}
    return {"anyOf": [*calls, answer] if final else calls}


@lru_cache(maxsize=256)
def openai_tools(agent: Agent) -> list[dict[str, Any]]:
    """The tools in the OpenAI tool-calling protocol's form (``tools=`` of a chat call)."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.schema()}}
            for t in agent.by_name.values()]


def call_options(agent: Agent, provider: Any, final: bool = True) -> dict[str, Any]:
    """A turn's call options: the tools natively for a provider that speaks the OpenAI
    tool-calling protocol (``supports_tools``; ``tool_choice="required"`` when a final
    output is not allowed yet), else the reply's JSON-schema union for constrained
    decoding (without the final output when it is not allowed yet)."""
    if getattr(provider, "supports_tools", False):
        out = {"max_tokens": agent.max_tokens, "tools": openai_tools(agent)}
        return out if final else out | {"tool_choice": "required"}
    return {"max_tokens": agent.max_tokens, "json_schema": reply_schema(agent, final)}


def _signature(name: str, schema: dict[str, Any]) -> str:
    """``name(a: integer, b: string = "x")`` from an argument model's JSON Schema."""
    required = set(schema.get("required", ()))
    parts = []
    for arg, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type") or "any" if isinstance(spec, dict) else "any"
        default = "" if arg in required or not isinstance(spec, dict) or "default" not in spec \
            else f" = {json.dumps(spec['default'])}"
        parts.append(f"{arg}: {kind}{default}")
    return f"{name}({', '.join(parts)})"


@lru_cache(maxsize=256)
def system_prompt(agent: Agent) -> str:
    """The system message: the task, the tools (a signature and the description each)
    and the reply protocol."""
    tools = "\n".join(f"- {_signature(t.name, t.schema())}: {t.description}"
                      for t in agent.by_name.values())
    fields = ", ".join(f'"{f}": ...' for f in agent.output.model_fields)
    first = next(iter(agent.by_name), "TOOL")
    return (f"{agent.instructions}\n\nTools:\n{tools}\n\n"
            f'Reply with one JSON object only. To call a tool: {{"tool": "{first}", '
            '"arguments": {...}}. To answer: {"final": {' + fields + "}}.")


def messages(agent: Agent, task: dict[str, Any], j: Journal) -> list[dict[str, str]]:
    """The prompt of the next turn: system, the task (the instance's context as JSON), then
    each journaled turn's reply and its calls' results (byte-identical on a resume, so
    recorded replies answer it; a provider speaking the OpenAI tool-calling protocol sends
    the turns natively, on the wire only: ``llm.tool_transcript``)."""
    out = [{"role": "system", "content": system_prompt(agent)},
           {"role": "user", "content": json.dumps(task, ensure_ascii=False, sort_keys=True)}]
    for turn in j.turns:
        out.append({"role": "assistant", "content": turn.get("reply", "")})
        results = [_result(j.done.get(c["id"]), c) for c in turn["calls"]]
        if turn.get("error"):
            results = [{"error": turn["error"]}]
        out.append({"role": "user", "content": RESULTS_PREFIX
                    + json.dumps(results, ensure_ascii=False, sort_keys=True)})
    return out


def _result(done: dict[str, Any] | None, call: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"call": call["id"], "tool": call["tool"]}
    if done is None:
        out["error"] = "not run"
    elif "error" in done:
        out["error"] = done["error"]
    else:
        out["result"] = done.get("result")
    return out


@dataclass(frozen=True, slots=True)
class Reply:
    """A parsed turn: ``calls`` to make, or ``final`` (the output as JSON), or ``error``."""

    calls: list[dict[str, Any]]
    final: dict[str, Any] | None = None
    error: str | None = None


def parse(text: str, turn: int, finish_reason: str | None = None) -> Reply:
    """The reply ``text`` of turn ``turn`` in the protocol (see the module doc); an
    unreadable one, or one whose calls (as JSON) are longer than ``MAX_CALLS_CHARS``, is
    ``Reply([], error=…)``, fed back to the model."""
    from ...errors import StructuredOutputError
    from ...structured import parse_structured
    try:
        data = parse_structured(text, None, finish_reason=finish_reason).data
    except StructuredOutputError as exc:
        return Reply([], error=f"unreadable reply: {exc}"[:500])
    if isinstance(data, dict) and "final" in data:
        final = data["final"]
        return Reply([], final=final if isinstance(final, dict) else {"answer": final})
    raw = data.get("tool_calls") if isinstance(data, dict) else None
    asked = raw if isinstance(raw, list) else [data]
    calls = []
    for n, c in enumerate(asked, start=1):
        if not isinstance(c, dict) or not isinstance(c.get("tool", c.get("name")), str):
            return Reply([], error='a reply is {"tool": NAME, "arguments": {...}} or '
                                   '{"final": ANSWER}')
        calls.append({"id": f"{turn}.{n}", "tool": c.get("tool", c.get("name")),
                      "arguments": c.get("arguments", {})})
    size = len(json.dumps(calls, ensure_ascii=False))
    if size > MAX_CALLS_CHARS:  # kept whole once (the llm_calls entry), never copied again
        return Reply([], error=f"the calls' arguments are {size:,} characters: at most "
                               f"{MAX_CALLS_CHARS:,} per turn")
    return Reply(calls)


# -- the commits -------------------------------------------------------------------------

def entry(rec: InstanceRecord, detail: dict[str, Any], now: float, *, tokens: int = 0,
          duration_ms: float = 0.0, turn: bool = False, error: str | None = None,
          outbox_done: tuple[str, dict[str, Any]] | None = None,
          waiting: bool = False, review: ReviewItem | None = None) -> StepCommit:
    """The commit journaling one row of kind ``tool``; the instance stays in its state
    (``running``, still owned, or ``waiting`` unowned on a review).  A ``turn`` counts
    one transition against ``max_transitions``."""
    new = outcome.clone(rec)
    new.tokens_used += tokens
    new.loop_count += 1 if turn else 0
    new.attempt, new.updated_at = 1, now
    new.status = WAITING if waiting else RUNNING
    if waiting:
        new.owner = None
        new.next_attempt_at = review.due_at if review is not None else None
    else:
        new.next_attempt_at = None
    new.seq += 1
    name = str(detail["tool"] if detail.get("agent") == "call" else detail.get("agent"))
    row = HistoryRow(instance_id=rec.id, seq=new.seq, source=rec.state, dest=rec.state,
                     trigger=name, at=now, kind=TOOL, duration_ms=duration_ms, tokens=tokens,
                     error=error, detail=detail, machine_version=rec.machine_version)
    return StepCommit(new, rec.version, [row], outbox_done=outbox_done, before=rec,
                      review_open=review)
