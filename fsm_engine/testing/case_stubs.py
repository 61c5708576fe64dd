"""What a case replays instead of running: recorded action results and recorded tool calls.

``stubbed(machine, case, problems)`` returns ``machine`` with

* the ``stub`` states' actions answered from the case's ``results`` (default: with
  ``results``, the machine's side-effect states), one recorded update per visit; a visit
  with none left fails its step;
* with ``tool_results`` (``{state: [{"visit", "call", "tool", "arguments", "result" |
  "error"}, …]}``, what ``fsm export-test`` records of every delivered side-effect tool
  call), each ``side_effect`` tool of an agent state answered from its recorded call of
  the same visit and call id: the tool's own code never runs, so a replay delivers
  nothing again.  A call with no recorded result, or made with other arguments than the
  recorded ones, is an error result to the model and a line in ``problems`` (the case
  fails naming it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ActionError, InvalidInput

__all__ = ["stubbed"]

#: The parameter a replayed tool takes its ``ToolCall`` by (never an argument).
_CALL = "_fsm_case_call"


def _recorded(state: Any, results: Sequence[Mapping[str, Any]]) -> Any:
    """An action answering each visit of ``state`` with its recorded update (sync for an
    ``inline`` state, else async: no thread either way)."""
    left = list(results)

    def answer(ctx: Any) -> dict[str, Any]:
        if not left:
            raise InvalidInput(f"state {state.name!r}: no recorded result left for this visit")
        return dict(left.pop(0))

    async def recorded(ctx: Any) -> dict[str, Any]:
        return answer(ctx)
    fn = answer if state.inline else recorded
    fn.__name__ = f"recorded_{state.name.replace('-', '_')}"
    return fn


def _replayed_tool(state: str, tool: Any, calls: Sequence[Mapping[str, Any]],
                   problems: list[str]) -> Any:
    """``tool`` answering each call from ``calls`` (by visit and call id), never running."""
    by_call = {(c.get("visit"), c.get("call")): c for c in calls if isinstance(c, Mapping)}

    @functools.wraps(tool.fn)  # the same name, docstring and arguments: the same prompt
    async def replayed(**kwargs: Any) -> Any:
        call = kwargs.pop(_CALL)
        for name in tool.call_params:
            kwargs.pop(name, None)
        where = f"state {state!r}: tool {tool.name} call {call.call} (visit {call.visit})"
        recorded = by_call.get((call.visit, call.call))
        if recorded is None:
            problems.append(f"{where}: no recorded result (a side effect is never run by a "
                            "case)")
            raise ActionError("no recorded result for this call", state=state)
        from .export import scrub  # the recorded arguments were written masked
        args = scrub(tool.args.model_validate(kwargs).model_dump(mode="json"))
        if args != recorded.get("arguments"):
            problems.append(f"{where}: recorded with arguments "
                            f"{json.dumps(recorded.get('arguments'), sort_keys=True)}, "
                            f"now {json.dumps(args, sort_keys=True)}")
            raise ActionError("the recorded call had other arguments", state=state)
        if "error" in recorded:
            raise ActionError(str(recorded["error"]), state=state)  # as it ended
        return recorded.get("result")

    new = dataclasses.replace(tool, fn=replayed)
    object.__setattr__(new, "call_params", (*new.call_params, _CALL))
    return new


def _with_tools(state: Any, calls: Sequence[Mapping[str, Any]], problems: list[str]) -> Any:
    """``state`` (an agent state) with its side-effect tools replayed from ``calls``."""
    agent = state.agent
    tools = [_replayed_tool(state.name, t, calls, problems) if t.side_effect else t
             for t in agent.tool_list]
    return dataclasses.replace(state, agent=dataclasses.replace(agent, tools=tools))


def _stub_one(state: Any, case: Mapping[str, Any], names: set[str],
              problems: list[str]) -> Any:
    results = case.get("results") or {}
    if state.name in names and state.action is not None:
        state = dataclasses.replace(state, action=_recorded(state, results.get(state.name, ())))
    tool_results = case.get("tool_results")
    if tool_results is not None and state.agent is not None \
            and any(t.side_effect for t in state.agent.tool_list):
        state = _with_tools(state, tool_results.get(state.name) or (), problems)
    return state


def stubbed(machine: Any, case: Mapping[str, Any], problems: list[str]) -> Any:
    """``machine`` with what ``case`` replays in place of running (see the module doc);
    ``problems`` collects what a replayed tool call found different."""
    results = case.get("results") or {}
    stub = case.get("stub")
    names = set(stub) if stub is not None else {s.name for s in machine.states
                                                 if s.side_effect and s.name in results}
    states = [_stub_one(s, case, names, problems) for s in machine.states]
    if all(a is b for a, b in zip(states, machine.states, strict=True)):
        return machine
    return dataclasses.replace(machine, states=states)
