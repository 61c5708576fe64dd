"""An agent state's step (issue 23): one model turn, or one tool call, per commit.

``step`` reads the visit's journal (``agent_journal``) from the instance's history and
does the next thing, whose commit journals it (through the driver's group committer and
``Ledger``: the one writer), the instance staying in its state:

1. a call of the last turn not yet done: an unknown tool or invalid arguments is an
   error result (counted; ``Agent.max_errors`` in a row end the loop with
   ``turns_exhausted``); a tool in ``approve`` waits for its review (``agent_review``);
   otherwise the tool runs (``agent_tools``), a ``side_effect`` tool under the outbox key
   ``instance:state:visit:turn:call``, marked done in the commit journaling its result;
2. else, after ``max_turns`` turns: ``turns_exhausted``;
3. else a model turn through ``step.llm``, streamed (``Agent.stream``: its pieces in the
   stream log as a plain step's ``step.llm.stream`` writes them), so replay, cache,
   budgets, deadline, breaker, rate limits, tracing and billing apply as to any step's
   call (a turn that cannot fit the budget is refused before the call and takes
   ``budget_exhausted``; ``State.timeout`` bounds each turn's call, ``State.retry``
   retries it): its calls are journaled, or its final output, validated by
   ``Agent.output``, fires ``Agent.done``.

A process killed anywhere resumes at the first thing not journaled: a call journaled is
never run again (its recorded result goes back to the model), a turn journaled is never
asked again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ...definition.agent import TURNS_EXHAUSTED, Agent, ToolCall
from ...errors import ActionError, InvalidInput, StaleWrite
from ...store.records import TOOL, OutboxBegin, StepCommit
from .. import outcome
from ..compiled import CompiledMachine
from ..fence import lease_fence
from . import agent_journal as journal
from . import agent_review, agent_tools, fork, reviews

if TYPE_CHECKING:
    from ...definition.spec import State
    from ...store.records import InstanceRecord
    from .base import DriverAPI as Driver  # the driver's public surface, no more


async def step(driver: Driver, cm: CompiledMachine, rec: InstanceRecord, state: State,
               now: float) -> StepCommit:
    """The commit of the next thing ``rec``'s agent state does (see the module doc)."""
    agent = state.agent
    assert agent is not None
    visit = rec.visits.get(state.name, 1)
    j = _journal(driver, rec, state.name, visit)
    try:
        commit = await _next(driver, cm, rec, state, agent, j, visit, now)
    except (InvalidInput, ActionError) as exc:  # an outcome's update or guard refused
        return driver.on_error(cm, rec, state, None, exc, 0.0)
    _remember(driver, rec, commit, j)
    return commit


def _journal(driver: Driver, rec: InstanceRecord, state: str, visit: int) -> journal.Journal:
    """The visit's journal: kept in memory from the step that committed ``rec`` (the
    record object the runner steps next), else read from the history."""
    kept = _kept(driver).get(rec.id)
    if kept is not None and kept[0] is rec:
        return kept[1]
    return journal.read(driver.store.history(rec.id), state, visit)


def _kept(driver: Driver) -> dict[str, tuple[InstanceRecord, journal.Journal]]:
    """The journals this driver keeps (instance id -> (record, journal)), ``kind_state``."""
    return driver.kind_state("agent")


def _remember(driver: Driver, rec: InstanceRecord, commit: StepCommit,
              j: journal.Journal) -> None:
    """Keep ``j`` with the journal row ``commit`` adds, for the step after it (dropped when
    the instance leaves the state or waits)."""
    new = commit.record
    kept = _kept(driver)
    if new.state != rec.state or new.status != "running" or new.owner is None:
        kept.pop(rec.id, None)
        return
    for row in commit.history:
        if row.kind == TOOL:
            j.add(row)
    kept[rec.id] = (new, j)


async def _next(driver: Driver, cm: CompiledMachine, rec: InstanceRecord, state: State,
                agent: Agent, j: journal.Journal, visit: int, now: float) -> StepCommit:
    """The commit of the next thing to do, given the journal ``j``."""
    call = j.pending()
    if call is not None:
        return await _call(driver, cm, rec, state, agent, j, call, visit, now)
    if j.errors_in_row >= agent.max_errors:
        return driver.advance(cm, rec, state, None, TURNS_EXHAUSTED, {}, 0.0, kind="fallback",
                              reason="tool_errors",
                              error=f"{j.errors_in_row} invalid calls or replies in a row")
    if len(j.turns) >= agent.max_turns:
        return driver.advance(cm, rec, state, None, TURNS_EXHAUSTED, {}, 0.0, kind="fallback",
                              reason="max_turns", error=f"{agent.max_turns} turns, no answer")
    return await _turn(driver, cm, rec, state, agent, j, visit, now)


async def _turn(driver: Driver, cm: CompiledMachine, rec: InstanceRecord, state: State,
                agent: Agent, j: journal.Journal, visit: int, now: float) -> StepCommit:
    """One model turn: its calls journaled, or its final output taken."""
    model_state = state if agent.llm is None else dataclasses.replace(state, llm=agent.llm)
    st = driver.make_step(cm, rec, model_state, spent=j.tokens,
                          long_visit=True)
    if state.timeout is not None:  # the state's timeout bounds each turn's model call
        st.llm.deadline = asyncio.get_running_loop().time() + state.timeout
    started = time.perf_counter()
    try:
        out = await _ask(st, agent, journal.messages(agent, rec.context, j),
                         journal.call_options(agent, st.llm.provider,
                                              j.calls_made >= agent.min_calls))
    except Exception as exc:  # budget, breaker, provider: as for any step's model call
        ms = (time.perf_counter() - started) * 1000.0
        if st.llm.rate_wait is not None:
            wait = st.llm.rate_wait
            return outcome.rate_limited(rec, error=str(wait), tokens=st.llm.used,
                                        next_at=now + wait.retry_in, now=now)
        return driver.on_error(cm, rec, state, st, exc, ms)
    ms = (time.perf_counter() - started) * 1000.0
    number = len(j.turns) + 1
    reply = journal.parse(out.text, number, out.finish_reason)
    if reply.final is not None and j.calls_made < agent.min_calls:
        reply = journal.Reply([], error=f"call a tool first: {agent.min_calls} call(s) are "
                                        "needed before the final answer")
    if reply.final is not None:
        try:
            output = agent.output.model_validate(reply.final).model_dump(mode="json")
        except ValidationError as exc:
            first = exc.errors()[0]
            reply = journal.Reply([], error=f"the final output is invalid: {first['msg']} at "
                                            f"{'.'.join(map(str, first['loc'])) or '(root)'}")
        else:
            st.notes["agent"] = {"turn": number, "final": True}
            return driver.advance(cm, rec, state, st, agent.done, output, ms)
    detail: dict[str, Any] = {"agent": "turn", "visit": visit, "turn": number,
                              "calls": reply.calls, "reply": out.text[:4000],
                              "llm_calls": st.llm.calls}
    if reply.error:
        detail["error"] = reply.error
    return journal.entry(rec, detail, now, tokens=st.llm.used, duration_ms=ms, turn=True,
                         error=reply.error)


async def _ask(st: Any, agent: Agent, messages: list[dict[str, str]],
               options: dict[str, Any]) -> Any:
    """One turn's model call: streamed (``Agent.stream``, the default: its text and tool
    calls reach the stream log as they come; the reply is JSON, so subscribers also get the
    object parsed so far), else a plain ``complete``.  The same layers, reply key and
    ``Completion`` either way (``step.llm.stream``); a provider that cannot stream this call
    (tool calls included) answers it whole, one piece (``runtime.calls.bill.streamed``)."""
    if agent.stream:
        return await st.llm.stream(messages, json_reply=True, **options).complete()
    return await st.llm.complete(messages, **options)


async def _call(driver: Driver, cm: CompiledMachine, rec: InstanceRecord, state: State,
                agent: Agent, j: journal.Journal, call: dict[str, Any], visit: int,
                now: float) -> StepCommit:
    """The next call of the last turn: an error result, a review, or the tool's result."""
    turn = int(call["id"].split(".")[0])
    base = {"agent": "call", "visit": visit, "turn": turn, "call": call["id"],
            "tool": str(call["tool"])}
    tool = agent.by_name.get(call["tool"])
    try:
        if tool is None:
            raise ValueError(f"unknown tool {call['tool']!r}; the tools are "
                             f"{', '.join(agent.by_name)}")
        args = tool.validate(call["arguments"])
    except ValueError as exc:
        return journal.entry(rec, {**base, "arguments": call["arguments"], "invalid": True,
                                   "error": str(exc)}, now, error=str(exc))
    if tool.name in agent.approve:
        decided = j.decided.get(call["id"])
        if decided is None:
            return _await_review(driver, cm, rec, agent, j, call, args, visit, now)
        args = decided["arguments"]
    key = f"{fork.outbox_key(rec, state.name, visit)}:{turn}:{call['id']}"
    done = None
    prior = _delivered_by_original(driver, rec, state.name, visit, call["id"], args) \
        if tool.side_effect else None
    if prior is not None:  # a fork: the original delivered this very call
        return journal.entry(rec, {**base, "arguments": args, "result": prior.get("result"),
                                   "delivered_by_original": prior.get(
                                       "idempotency_key", prior.get("delivered_by_original"))},
                             now)
    driver.check_lease(rec)  # no tool starts under a lease that ran out (a model turn took)
    if tool.side_effect:
        await _begin_delivery(driver, rec, state.name, visit, key)
        base["idempotency_key"] = key
        done = (key, {"visit": visit, "call": call["id"]})
    started = time.perf_counter()
    run = partial(agent_tools.run, tool, args,
                  ToolCall(rec.id, state.name, visit, turn, call["id"], key),
                  limit=agent.max_result_chars, threads=driver.threads, rng=driver.rng,
                  fence=lease_fence(rec, driver.clock, driver.lease_current, "tool"))
    if driver.tracer is None:
        result, error, attempts = await run()
    else:
        from ...telemetry import traced_tool
        result, error, attempts = await traced_tool(driver.tracer, tool.name, call["id"], run)
    ms = (time.perf_counter() - started) * 1000.0
    detail = {**base, "arguments": args, "attempts": attempts,
              **({"error": error} if error is not None else {"result": result})}
    return journal.entry(rec, detail, driver.clock(), duration_ms=ms, error=error,
                         outbox_done=done)


async def _begin_delivery(driver: Driver, rec: InstanceRecord, state: str, visit: int,
                          key: str) -> None:
    """Count this attempt on the outbox row of ``key``; ``StaleWrite`` when that row is
    ``done`` already: the call was delivered and journaled (by the worker that took the
    instance over while this one stalled), and must not run again (matrix finding A1)."""
    box = await driver.begins(OutboxBegin(key, rec.id, state, visit, driver.clock()))
    if box.status == "done":
        raise StaleWrite(f"instance {rec.id}: the call of outbox key {key} was delivered "
                         "and journaled already (another worker owns it now)",
                         instance_id=rec.id)


def _delivered_by_original(driver: Driver, rec: InstanceRecord, state: str, visit: int,
                           call: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """For a fork (not ``redeliver``): the journaled call ``call`` of this visit of the
    nearest ancestor up its lineage (``fork.ancestors``) that delivered it with the same
    arguments (``None``: deliver anew)."""
    if rec.forked_from is None or rec.fork_options.get("redeliver"):
        return None
    from ...errors import FsmError
    for up in fork.ancestors(rec, driver.store.get):
        try:
            rows = driver.store.history(up)
        except FsmError:  # that ancestor was pruned: look further up
            continue
        prior = journal.read(rows, state, visit).done.get(call)
        if prior is not None and prior.get("arguments") == args and "error" not in prior:
            return prior
    return None


def _await_review(driver: Driver, cm: CompiledMachine, rec: InstanceRecord, agent: Agent,
                  j: journal.Journal, call: dict[str, Any], args: dict[str, Any], visit: int,
                  now: float) -> StepCommit:
    """A call waiting for approval: its item opened, the wait kept, or the SLA's choice.
    An ``ask`` row naming another instance's item (a fork copied it from its original)
    opens this instance's own (``agent_review.reopened``): nothing else could end its wait."""
    asked = j.asked.get(call["id"])
    if asked is None:
        return agent_review.ask(rec, agent, call, args, visit, now)
    own = agent_review.item_id(rec.id, rec.state, visit, call["id"])
    if asked.get("item") != own and not driver.store.reviews(id_prefix=own):
        return agent_review.reopened(rec, agent, call, args, visit, now)
    if reviews.timer_due(rec, now) and agent.on_timeout is not None:
        items = driver.store.reviews(id_prefix=own)
        if items:
            return reviews.decision(cm, rec, items[0], agent.on_timeout, by=reviews.SLA,
                                    now=now, advance=driver.advance,
                                    note=f"no decision within {agent.sla_s:g} s")
    new = outcome.clone(rec)  # still waiting: hold no worker
    new.status, new.owner, new.updated_at = "waiting", None, now
    return StepCommit(new, rec.version, before=rec)
