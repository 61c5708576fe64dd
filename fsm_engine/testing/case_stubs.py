"""What a case replays instead of running: recorded action results and recorded tool calls.

``stubbed(machine, case, problems, inputs)`` returns ``machine`` with

* the ``stub`` states' actions answered from the case's ``results`` (default: with
  ``results``, the machine's side-effect states), one recorded update per visit; a visit
  with none left fails its step;
* with ``tool_results`` (``{state: [{"visit", "call", "tool", "arguments", "result" |
  "error"}, …]}``, what ``fsm export-test`` records of every delivered side-effect tool
  call), each ``side_effect`` tool of an agent state answered from its recorded call of
  the same visit and call id: the tool's own code never runs, so a replay delivers
  nothing again.  A call with no recorded result, or made with other arguments than the
  recorded ones, is an error result to the model and a line in ``problems`` (the case
  fails naming it);
* with ``branch_results`` (``[{"input", "results", "tool_results"}, …]``, one per fan-out
  descendant that delivered a side effect), every branch machine's side-effect states
  and side-effect tools answered the same way from the entry whose ``input`` is the
  replayed child's (``inputs``: an instance's input by id, read from the replay's store).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ActionError, InvalidInput

__all__ = ["stubbed", "Inputs"]

#: The parameter a replayed tool takes its ``ToolCall`` by (never an argument).
_CALL = "_fsm_case_call"
Find = Callable[[Any], "Mapping[str, Any] | None"]


class Inputs:
    """An instance's input by id, from ``store`` (set once the replay's engine exists)."""

    def __init__(self) -> None:
        self.store: Any = None

    def __call__(self, instance_id: str) -> dict[str, Any]:
        return dict(self.store.get(instance_id).input) if self.store is not None else {}


def _action(state: Any, answer: Callable[[Any, Any], dict[str, Any]]) -> Any:
    """``answer`` as ``state``'s action (sync for an ``inline`` state, else async: no
    thread either way)."""
    async def recorded(ctx: Any, step: Any) -> dict[str, Any]:
        return answer(ctx, step)
    fn = answer if state.inline else recorded
    fn.__name__ = f"recorded_{state.name.replace('-', '_')}"
    return fn


def _recorded(state: Any, results: Sequence[Mapping[str, Any]]) -> Any:
    """An action answering each visit of ``state`` with its recorded update."""
    left = list(results)

    def answer(ctx: Any, step: Any) -> dict[str, Any]:
        if not left:
            raise InvalidInput(f"state {state.name!r}: no recorded result left for this visit")
        return dict(left.pop(0))
    return _action(state, answer)


def _branch_recorded(state: Any, entries: list[dict[str, Any]], inputs: Inputs) -> Any:
    """An action answering each visit of a branch's ``state`` from the recorded entry of
    the replayed child's input."""
    def answer(ctx: Any, step: Any) -> dict[str, Any]:
        want = inputs(step.instance_id)
        for entry in entries:
            left = entry["results"].get(state.name)
            if entry.get("input") == want and left:
                return dict(left.pop(0))
        raise InvalidInput(f"state {state.name!r}: no recorded result left for this "
                           "branch's visit")
    return _action(state, answer)


def _replayed_tool(state: str, tool: Any, find: Find, problems: list[str]) -> Any:
    """``tool`` answering each call from ``find(call)`` (its recorded call), never running."""
    @functools.wraps(tool.fn)  # the same name, docstring and arguments: the same prompt
    async def replayed(**kwargs: Any) -> Any:
        call = kwargs.pop(_CALL)
        for name in tool.call_params:
            kwargs.pop(name, None)
        where = f"state {state!r}: tool {tool.name} call {call.call} (visit {call.visit})"
        recorded = find(call)
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


def _by_call(calls: Sequence[Any]) -> Find:
    table = {(c.get("visit"), c.get("call")): c for c in calls if isinstance(c, Mapping)}
    return lambda call: table.get((call.visit, call.call))


def _by_input(state: str, entries: list[dict[str, Any]], inputs: Inputs) -> Find:
    def find(call: Any) -> Mapping[str, Any] | None:
        want = inputs(call.instance_id)
        for entry in entries:
            if entry.get("input") == want:
                found = _by_call((entry.get("tool_results") or {}).get(state) or ())(call)
                if found is not None:
                    return found
        return None
    return find


def _with_tools(state: Any, find: Find, problems: list[str]) -> Any:
    """``state`` (an agent state) with its side-effect tools replayed by ``find``."""
    agent = state.agent
    if agent is None or not any(t.side_effect for t in agent.tool_list):
        return state
    tools = [_replayed_tool(state.name, t, find, problems) if t.side_effect else t
             for t in agent.tool_list]
    return dataclasses.replace(state, agent=dataclasses.replace(agent, tools=tools))


class _Stubs:
    """One case's stubbing (its problems list, the children's entries, ``inputs``)."""

    def __init__(self, case: Mapping[str, Any], problems: list[str], inputs: Inputs) -> None:
        self.case, self.problems, self.inputs = case, problems, inputs
        branches = case.get("branch_results")
        self.entries: list[dict[str, Any]] | None = None if branches is None else [
            {**e, "results": {k: list(v) for k, v in (e.get("results") or {}).items()}}
            for e in branches if isinstance(e, Mapping)]

    def root(self, machine: Any) -> Any:
        results = self.case.get("results") or {}
        stub = self.case.get("stub")
        names = set(stub) if stub is not None else {s.name for s in machine.states
                                                     if s.side_effect and s.name in results}
        tool_results = self.case.get("tool_results")
        states = []
        for s in machine.states:
            if s.name in names and s.action is not None:
                s = dataclasses.replace(s, action=_recorded(s, results.get(s.name, ())))
            if tool_results is not None:
                s = _with_tools(s, _by_call(tool_results.get(s.name) or ()), self.problems)
            states.append(self._fan_out(s))
        return _replaced(machine, states)

    def branch(self, machine: Any) -> Any:
        """A branch machine with its side effects answered from the children's entries."""
        entries = self.entries
        assert entries is not None
        states = []
        for s in machine.states:
            if s.side_effect and s.action is not None:
                s = dataclasses.replace(s, action=_branch_recorded(s, entries, self.inputs))
            s = _with_tools(s, _by_input(s.name, entries, self.inputs), self.problems)
            states.append(self._fan_out(s))
        return _replaced(machine, states)

    def _fan_out(self, state: Any) -> Any:
        """``state`` with its fan-out's branch machines stubbed (children's entries)."""
        from ..definition.fanout import Map
        fan_out = state.fan_out
        if fan_out is None or self.entries is None:
            return state
        if isinstance(fan_out, Map):
            new = dataclasses.replace(fan_out, machine=self._one(fan_out.machine))
        else:
            new = dataclasses.replace(fan_out, branches={
                name: self._one(b) for name, b in fan_out.branches.items()})
        return dataclasses.replace(state, fan_out=new)

    def _one(self, branch: Any) -> Any:
        from ..definition.fanout import Branch
        from ..definition.spec import Machine
        if isinstance(branch, Machine):
            return self.branch(branch)
        if isinstance(branch, Branch) and isinstance(branch.run, Machine):
            return dataclasses.replace(branch, run=self.branch(branch.run))
        return branch  # an action: never a side effect of its own


def _replaced(machine: Any, states: list[Any]) -> Any:
    if all(a is b for a, b in zip(states, machine.states, strict=True)):
        return machine
    return dataclasses.replace(machine, states=states)


def stubbed(machine: Any, case: Mapping[str, Any], problems: list[str],
            inputs: Inputs | None = None) -> Any:
    """``machine`` with what ``case`` replays in place of running (see the module doc);
    ``problems`` collects what a replayed tool call found different."""
    return _Stubs(case, problems, inputs or Inputs()).root(machine)
