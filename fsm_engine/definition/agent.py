"""``Agent``: a tool-calling loop inside one state (issue 23), and its ``Tool`` s.

``State("research", agent=Agent(tools=[list_files, read_file], output=Answer))``: the
model is called in *turns*; each turn either calls tools (their results go back to the
model in the next turn) or gives the final output, validated by ``output`` and applied
to the context (its fields are context fields).  Every turn and every tool call is a
durable step of its own (``fsm_engine.runtime.kinds.agent``).

A tool is a plain ``def`` / ``async def`` with type hints: its argument model is derived
from its signature (pydantic), its docstring is its description.  A parameter annotated
``ToolCall`` is not an argument: the runtime passes what identifies the call (its
idempotency key, for a side effect).  ``tool(fn, side_effect=…, timeout=…, retry=…)``
(or ``@tool(...)``) sets a tool's policies; a bare function is a tool with none.

Outcomes (triggers declared from the state): ``done`` (the final output; ``Agent.done``
names another), ``turns_exhausted`` (``max_turns`` model turns made without a final
output, or ``max_errors`` invalid calls in a row), ``budget_exhausted`` (a turn that
cannot fit the token budget is refused before the call), ``rejected`` (a reviewer
refused a call of a tool in ``approve``; needed only with ``approve``).

``AGENT`` is the agent kind as the definition layer sees it (``definition.kind``).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ..policies import RetryPolicy

if TYPE_CHECKING:
    from .kind import Site
    from .spec import State

__all__ = ["Agent", "Tool", "ToolCall", "tool", "DONE", "TURNS_EXHAUSTED", "REJECTED",
           "AGENT_OUTCOMES"]

DONE = "done"
TURNS_EXHAUSTED = "turns_exhausted"
REJECTED = "rejected"
#: The outcomes every agent state declares (``rejected`` only with ``approve``).
AGENT_OUTCOMES = (TURNS_EXHAUSTED, "budget_exhausted")

_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """What identifies one tool call (passed to a parameter annotated ``ToolCall``).

    ``idempotency_key`` is ``"{instance_id}:{state}:{visit}:{turn}:{call}"``: stable across
    crash recoveries; send it with any external effect.  ``attempt``: 1-based (retries).
    """

    instance_id: str
    state: str
    visit: int
    turn: int
    call: str
    idempotency_key: str
    attempt: int = 1


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an unresolvable annotation: reported as a missing hint
        return {}


@dataclass(frozen=True)
class Tool:
    """One tool: ``fn`` and its policies.

    Args:
        fn: a ``def`` or ``async def``; every parameter has a type hint.
        name: the name the model calls it by (default ``fn.__name__``).
        description: what the model is told (default: ``fn``'s docstring).
        side_effect: the call has an external effect: it goes through the outbox under
            ``ToolCall.idempotency_key`` (at most one completed delivery).
        timeout: seconds one attempt may take (``None``: no limit); a timeout is an
            error result to the model.
        retry: retries of an exception the tool raises (``None``: one attempt).
    """

    fn: Callable[..., Any]
    name: str = ""
    description: str = ""
    side_effect: bool = False
    timeout: float | None = None
    retry: RetryPolicy | None = None
    #: Parameters that take the ``ToolCall`` (not arguments).
    call_params: tuple[str, ...] = field(default=(), compare=False)
    #: The argument model (``None`` when a parameter has no type hint).
    args: type[BaseModel] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        name = self.name or getattr(self.fn, "__name__", "")
        doc = self.description or inspect.getdoc(self.fn) or ""
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "description", doc.strip())
        hints = _hints(self.fn)
        params = self._params()
        calls = tuple(p.name for p in params if hints.get(p.name) is ToolCall)
        object.__setattr__(self, "call_params", calls)
        if all(p.name in hints for p in params):
            fields: dict[str, Any] = {
                p.name: (hints[p.name], ... if p.default is p.empty else p.default)
                for p in params if p.name not in calls}
            model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"),
                                 **fields)
            object.__setattr__(self, "args", model)

    def _params(self) -> list[inspect.Parameter]:
        try:
            return list(inspect.signature(self.fn).parameters.values())
        except (TypeError, ValueError):
            return []

    @property
    def is_async(self) -> bool:
        """True for an ``async def`` tool."""
        return inspect.iscoroutinefunction(self.fn)

    def validate(self, arguments: Any) -> dict[str, Any]:
        """``arguments`` validated by the argument model (a JSON-able dict); raises
        ``ValueError`` with a one-line reason."""
        if self.args is None:
            raise ValueError(f"tool {self.name!r} has no argument model")
        if not isinstance(arguments, dict):
            raise ValueError(f"arguments must be a JSON object, not {type(arguments).__name__}")
        try:
            return self.args.model_validate(arguments).model_dump(mode="json")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "(root)"
            raise ValueError(f"invalid arguments for {self.name}: {first['msg']} at {where}") \
                from None

    def schema(self) -> dict[str, Any]:
        """The arguments' JSON Schema (``{}`` without a model)."""
        return self.args.model_json_schema() if self.args is not None else {}

    def problems(self) -> list[str]:
        """What is wrong with this tool (empty when nothing is)."""
        where = f"tool {self.name!r}"
        out = []
        if not _TOOL_NAME.fullmatch(self.name):
            out.append(f"{where}: name must be letters, digits and '_' (at most 64)")
        missing = [p.name for p in self._params() if p.name not in _hints(self.fn)]
        if missing:
            out.append(f"{where}: parameter(s) {', '.join(missing)} have no type hint")
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in self._params()):
            out.append(f"{where}: *args / **kwargs cannot be described to the model")
        if self.timeout is not None and self.timeout <= 0:
            out.append(f"{where}: timeout must be > 0 seconds")
        if self.retry is not None:
            out.extend(f"{where}: retry policy: {p}" for p in self.retry.problems())
        return out

    def export(self) -> dict[str, Any]:
        """A plain-dict view (diagrams, fingerprint)."""
        return {"name": self.name, "side_effect": self.side_effect, "timeout": self.timeout,
                "retry": self.retry is not None, "arguments": self.schema()}


def tool(fn: Callable[..., Any] | None = None, *, name: str = "", side_effect: bool = False,
         timeout: float | None = None, retry: RetryPolicy | None = None) -> Any:
    """``tool(fn, ...)`` or ``@tool(...)``: ``fn`` as a ``Tool`` with these policies."""
    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, side_effect=side_effect, timeout=timeout, retry=retry)
    return wrap if fn is None else wrap(fn)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """``obj`` as a ``Tool`` (a bare function gets no policies)."""
    return obj if isinstance(obj, Tool) else Tool(obj)


@dataclass(frozen=True)
class Agent:
    """A tool-calling loop run by a state (see the module doc).

    Args:
        tools: ``Tool`` s or plain functions.
        instructions: the system prompt's task (the protocol is added by the runtime).
        max_turns: model turns per visit (each counts against ``max_transitions``).
        approve: names of tools whose every call waits for a person (``fsm review``).
        output: pydantic model of the final output; its fields are context fields.
        llm: the model name (like ``State.llm``; ``None``: the state's, else the default).
        max_tokens: the completion limit of one turn (tokens).
        max_errors: invalid calls (unknown tool, bad arguments, unreadable reply) in a
            row that end the loop with ``turns_exhausted``.
        max_result_chars: a tool result whose JSON is longer is an error result.
        sla_s: seconds an approval may stay undecided before ``on_timeout`` is taken
            (give both or neither).
        on_timeout: the choice taken past ``sla_s``: ``"approve"`` or ``"reject"``.
        done: the trigger the final output fires.
        min_calls: tool calls made before a final output is accepted: until then the
            reply schema (or ``tool_choice="required"``) allows only calls, and a final
            output is an error result (for small models that answer from memory).
        stream: each turn is a streamed call (``step.llm.stream``): its text and tool
            calls go to the stream log as they are generated (``fsm stream``, the
            viewer), its ``Completion`` the same as ``complete()``'s (same reply key,
            tokens, cache and replay), so it is on by default; ``False``: a plain
            ``complete()`` per turn, nothing in the stream log.  Not part of the
            definition's fingerprint (it changes no outcome).
    """

    tools: Sequence[Tool | Callable[..., Any]]
    output: type[BaseModel]
    instructions: str = ""
    max_turns: int = 8
    approve: Sequence[str] = ()
    llm: str | None = None
    max_tokens: int = 512
    max_errors: int = 3
    max_result_chars: int = 8000
    sla_s: float | None = None
    on_timeout: str | None = None
    done: str = DONE
    min_calls: int = 0
    stream: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(as_tool(t) for t in self.tools))
        object.__setattr__(self, "approve", tuple(self.approve))

    @property
    def tool_list(self) -> list[Tool]:
        """The tools, in declaration order."""
        return [as_tool(t) for t in self.tools]

    @property
    def by_name(self) -> dict[str, Tool]:
        """The tools by name."""
        return {t.name: t for t in self.tool_list}

    def outcomes(self) -> tuple[str, ...]:
        """The triggers this agent's state must declare."""
        return (self.done, *AGENT_OUTCOMES, *((REJECTED,) if self.approve else ()))

    def problems(self, state: str, fields: Sequence[str], triggers: Sequence[str]) -> list[str]:
        """Every problem of this agent on ``state`` (context ``fields``, its ``triggers``)."""
        where = f"state {state!r}: agent"
        out = [f"{where}: {p}" for t in self.by_name.values() for p in t.problems()]
        names = [t.name for t in self.tool_list]
        out += [f"{where}: tool {n!r} is declared twice" for n in sorted(set(names))
                if names.count(n) > 1]
        if not names:
            out.append(f"{where}: has no tools")
        out += [f"{where}: approve names unknown tool {n!r}" for n in self.approve
                if n not in names]
        out += [f"{where}: outcome {t!r} is not a trigger declared from {state!r}"
                for t in self.outcomes() if t not in triggers]
        out += self._bound_problems(where)
        if isinstance(self.output, type) and issubclass(self.output, BaseModel):
            out += [f"{where}: output field {f!r} is not a context field"
                    for f in self.output.model_fields if f not in fields]
        else:
            out.append(f"{where}: output must be a pydantic BaseModel subclass")
        return out

    def _bound_problems(self, where: str) -> list[str]:
        out = [] if isinstance(self.min_calls, int) and 0 <= self.min_calls else [
            f"{where}: min_calls must be an int >= 0"]
        if not isinstance(self.stream, bool):
            out.append(f"{where}: stream must be True or False")
        out += [f"{where}: {k} must be an int >= 1" for k in
               ("max_turns", "max_tokens", "max_errors", "max_result_chars")
               if not isinstance(getattr(self, k), int) or getattr(self, k) < 1]
        if (self.sla_s is None) != (self.on_timeout is None):
            out.append(f"{where}: sla_s and on_timeout go together")
        if self.sla_s is not None and self.sla_s <= 0:
            out.append(f"{where}: sla_s must be > 0 seconds")
        if self.on_timeout not in (None, "approve", "reject"):
            out.append(f"{where}: on_timeout must be 'approve' or 'reject'")
        return out

    def export(self) -> dict[str, Any]:
        """A plain-dict view (diagrams, fingerprint)."""
        return {"tools": [t.export() for t in self.tool_list],
                "max_turns": self.max_turns, "approve": list(self.approve),
                "output": self.output.model_json_schema()
                if isinstance(self.output, type) and issubclass(self.output, BaseModel) else None,
                "llm": self.llm, "done": self.done}


class AgentKind:
    """``State(agent=Agent(...))`` on the ``definition.kind.StateKind`` protocol."""

    name, waits = "agent", False

    def matches(self, state: State) -> bool:
        return state.agent is not None

    def parks(self, state: State) -> bool:
        return False

    def calls_model(self, state: State) -> bool:
        return True

    def problems(self, site: Site) -> list[str]:
        s, where = site.state, site.where
        assert s.agent is not None
        out = []
        if s.final or s.wait or s.action is not None or s.review is not None or s.fan_out:
            out.append(f"{where}: an agent state has no action, review or fan-out and is "
                       "neither final nor wait")
        if s.agent.llm is not None and s.llm is not None and s.agent.llm != s.llm:
            out.append(f"{where}: llm {s.llm!r} and agent llm {s.agent.llm!r} differ")
        return out + s.agent.problems(s.name, site.fields, site.triggers)

    def export(self, site: Site) -> dict[str, Any]:
        assert site.state.agent is not None
        return {"agent": site.state.agent.export()}

    def notes(self, exported: Mapping[str, Any]) -> list[str]:
        """``agent ≤8 turns``, the tools (``*``: a side effect) and those needing approval."""
        agent = exported.get("agent")
        if not agent:
            return []
        tools = [f"{t['name']}{'*' if t.get('side_effect') else ''}" for t in agent["tools"]]
        notes = [f"agent ≤{agent['max_turns']} turns", "tools: " + ", ".join(tools)]
        if agent.get("approve"):
            notes.append("approve: " + ", ".join(agent["approve"]))
        return notes


AGENT = AgentKind()
