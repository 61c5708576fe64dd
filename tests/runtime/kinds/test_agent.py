"""Agent states (issue 23): the loop, its journal, its bounds and bad tool output.

Scripted model; real SQLite files and the real PostgreSQL cluster (``engine_factory``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import agent_machine
import pytest
from agent_replies import LOOP, calls, final
from pydantic import BaseModel

from fsm_engine import Agent, DefinitionError, Engine, Machine, State, Transition
from fsm_engine.llm import Scripted
from fsm_engine.runtime.compiled import compile_machine
from fsm_engine.store.records import TOOL

Q = {"question": "what is 2 + 3?"}


def _tool_rows(engine: Engine, iid: str) -> list[Any]:
    return [r for r in engine.store.history(iid) if r.kind == TOOL]


def _run(engine: Engine, machine: Machine, data: dict[str, Any] = Q) -> Any:
    iid = engine.start(machine, data)
    return asyncio.run(engine.run(iid))


def test_a_three_turn_four_call_loop_journals_every_turn_and_call(
        engine_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, sink = tmp_path / "tools.jsonl", tmp_path / "sink.jsonl"
    monkeypatch.setenv("AGENT_TOOL_LOG", str(log))
    monkeypatch.setenv("AGENT_SINK", str(sink))
    engine = engine_factory(llm=Scripted.from_replies(LOOP))
    rec = _run(engine, agent_machine.machine)
    assert (rec.status, rec.state, rec.context["answer"]) == ("completed", "answered", "5")
    rows = _tool_rows(engine, rec.id)
    kinds = [(r.detail["agent"], r.detail.get("tool")) for r in rows]
    assert kinds == [("turn", None), ("call", "add"), ("call", "echo"), ("turn", None),
                     ("call", "echo"), ("call", "send_report")]
    assert [r.detail["result"] for r in rows if r.detail["agent"] == "call"] == \
        [5, "hi", "again", "sent"]
    assert all(r.source == r.dest == "research" for r in rows)
    # each turn's tokens on its row; the final turn's on the transition; all billed
    assert [r.tokens for r in rows if r.detail["agent"] == "turn"] == [20, 20]
    assert rec.tokens_used == 60
    assert rec.loop_count == 3  # three turns, the last one the transition out
    ran = [json.loads(x)["tool"] for x in log.read_text().splitlines()]
    assert ran == ["add", "echo", "echo", "send_report"]
    [delivery] = [json.loads(x) for x in sink.read_text().splitlines()]
    assert delivery["key"] == f"{rec.id}:research:1:2:2.2"
    [box] = engine.store.outbox(rec.id)
    assert (box.key, box.status) == (delivery["key"], "done")


def test_the_model_sees_each_result_in_the_next_turn(engine_factory: Any) -> None:
    model = Scripted.from_replies(LOOP)
    engine = engine_factory(llm=model)
    _run(engine, agent_machine.machine)
    second = model.requests[1]
    assert second[-2] == {"role": "assistant", "content": json.dumps(
        {"tool_calls": LOOP[0]["tool_calls"]})}
    fed = json.loads(second[-1]["content"].removeprefix("Tool results: "))
    assert fed == [{"call": "1.1", "tool": "add", "result": 5},
                   {"call": "1.2", "tool": "echo", "result": "hi"}]
    assert "add" in second[0]["content"] and "Add two integers." in second[0]["content"]


def test_a_single_call_reply_and_the_schema_union_are_understood(engine_factory: Any) -> None:
    model = Scripted.from_replies([
        {"text": '{"tool": "add", "arguments": {"a": 1, "b": 1}}'}, final("2")])
    engine = engine_factory(llm=model)
    rec = _run(engine, agent_machine.machine)
    assert rec.context["answer"] == "2"
    from fsm_engine.runtime.kinds.agent_journal import reply_schema
    schema = reply_schema(agent_machine.machine.state("research").agent)
    consts = [b["properties"].get("tool", {}).get("const") for b in schema["anyOf"]]
    assert consts[:2] == ["add", "echo"] and "final" in schema["anyOf"][-1]["properties"]


def test_a_model_that_never_stops_ends_at_exactly_max_turns(engine_factory: Any) -> None:
    model = Scripted.from_replies([calls(("add", {"a": 1, "b": 2}))])
    engine = engine_factory(llm=model)
    rec = _run(engine, agent_machine.machine)
    assert (rec.state, rec.status) == ("turns_exhausted", "completed")
    assert model.calls == 4  # max_turns
    turns = [r for r in _tool_rows(engine, rec.id) if r.detail["agent"] == "turn"]
    assert len(turns) == 4
    assert engine.store.history(rec.id)[-1].reason == "max_turns"


def test_a_budget_that_runs_out_mid_loop_refuses_the_call_at_zero_tokens(
        engine_factory: Any) -> None:
    m = agent_machine._machine("agent-budget", Agent(tools=agent_machine.TOOLS,
                               output=agent_machine.Answer, max_turns=8, max_tokens=64),
                               token_budget=2000)
    big = calls(("add", {"a": 1, "b": 2}), tokens=450)  # 900 a turn: the third cannot fit
    model = Scripted.from_replies([big])
    engine = engine_factory(llm=model)
    rec = _run(engine, m)
    assert rec.state == "budget_exhausted"
    served = model.calls
    last = engine.store.history(rec.id)[-1]
    assert (last.trigger, last.tokens, last.reason) == ("budget_exhausted", 0, "token_budget")
    assert served == 2 and rec.tokens_used == 1800


def test_the_state_budget_counts_every_turn_of_the_visit(engine_factory: Any) -> None:
    m = Machine(name="agent-state-budget", context=agent_machine.Ctx, initial="research",
                max_transitions=50, states=[
                    State("research", token_budget=2000, agent=Agent(
                        tools=agent_machine.TOOLS, output=agent_machine.Answer, max_turns=8)),
                    State("answered", final=True), State("out", final=True)],
                transitions=[Transition("done", "research", "answered"),
                             Transition("turns_exhausted", "research", "out"),
                             Transition("budget_exhausted", "research", "out")])
    model = Scripted.from_replies([calls(("add", {"a": 1, "b": 2}), tokens=450)])
    engine = engine_factory(llm=model)
    rec = _run(engine, m)
    last = engine.store.history(rec.id)[-1]
    assert (rec.state, last.trigger, last.tokens) == ("out", "budget_exhausted", 0)
    assert model.calls == 2 and rec.tokens_used == 1800


def test_turns_count_against_max_transitions(engine_factory: Any) -> None:
    m = agent_machine._machine("agent-cap", Agent(tools=agent_machine.TOOLS,
                               output=agent_machine.Answer, max_turns=50), max_transitions=3)
    model = Scripted.from_replies([calls(("add", {"a": 1, "b": 2}))])
    engine = engine_factory(llm=model)
    rec = _run(engine, m)
    assert (rec.status, rec.reason) == ("failed", "loop_limit")
    assert model.calls == 3


@pytest.mark.parametrize(("tool", "expected"), [
    ("boom", "RuntimeError: the disk is on fire"),
    ("huge", "too large: 100002 characters of JSON"),
    ("opaque", "not JSON (object)"),
    ("stall", "TimeoutError: tool stall took longer than 0.2 s"),
    ("stall_sync", "TimeoutError: tool stall_sync took longer than 0.2 s"),
])
def test_bad_tool_output_is_an_error_result_and_the_instance_goes_on(
        engine_factory: Any, tool: str, expected: str) -> None:
    model = Scripted.from_replies([calls((tool, {})), final("coped")])
    engine = engine_factory(llm=model)
    rec = _run(engine, agent_machine.machine)
    assert (rec.status, rec.context["answer"]) == ("completed", "coped")
    [call] = [r for r in _tool_rows(engine, rec.id) if r.detail["agent"] == "call"]
    assert expected in call.detail["error"] and "result" not in call.detail
    assert expected in model.requests[1][-1]["content"]


def test_a_tool_retry_policy_retries_inside_the_call(engine_factory: Any) -> None:
    agent_machine._flaky_runs.clear()
    engine = engine_factory(llm=Scripted.from_replies([calls(("flaky", {})), final("ok")]))
    rec = _run(engine, agent_machine.machine)
    [call] = [r for r in _tool_rows(engine, rec.id) if r.detail["agent"] == "call"]
    assert (call.detail["result"], call.detail["attempts"]) == ("ok", 3)


def test_unknown_tools_and_bad_arguments_go_back_to_the_model_then_end_the_loop(
        engine_factory: Any) -> None:
    model = Scripted.from_replies([calls(("rm_rf", {})), calls(("add", {"a": "x"})),
                                   {"text": "I refuse to use JSON"}, final("never")])
    engine = engine_factory(llm=model)
    rec = _run(engine, agent_machine.machine)
    assert rec.state == "turns_exhausted"
    assert engine.store.history(rec.id)[-1].reason == "tool_errors"
    rows = _tool_rows(engine, rec.id)
    errors = [r.detail.get("error", "") for r in rows if r.detail.get("error")]
    assert "unknown tool 'rm_rf'" in errors[0]
    assert "invalid arguments for add" in errors[1] and "at a" in errors[1]
    assert errors[2].startswith("unreadable reply")
    assert model.calls == 3


def test_an_invalid_final_output_is_fed_back_and_can_be_fixed(engine_factory: Any) -> None:
    model = Scripted.from_replies([{"text": '{"final": {"answr": "5"}}'}, final("5")])
    engine = engine_factory(llm=model)
    rec = _run(engine, agent_machine.machine)
    assert rec.context["answer"] == "5"
    assert "the final output is invalid" in model.requests[1][-1]["content"]


# -- declaration ----------------------------------------------------------------------------

class _Out(BaseModel):
    nope: str


def _no_hint(x) -> str:  # type: ignore[no-untyped-def]
    return str(x)


def test_every_problem_of_an_agent_state_is_listed_at_load() -> None:
    class Ctx(BaseModel):
        question: str
    bad = Machine(name="bad", context=Ctx, initial="r", states=[
        State("r", agent=Agent(tools=[agent_machine.add, _no_hint], output=_Out,
                               approve=["send_mail"], max_turns=0)),
        State("end", final=True)], transitions=[Transition("done", "r", "end")])
    with pytest.raises(DefinitionError) as err:
        compile_machine(bad)
    text = "\n".join(err.value.problems)
    for needle in ("tool '_no_hint': parameter(s) x have no type hint",
                   "approve names unknown tool 'send_mail'",
                   "outcome 'turns_exhausted' is not a trigger",
                   "outcome 'budget_exhausted' is not a trigger",
                   "outcome 'rejected' is not a trigger",
                   "output field 'nope' is not a context field",
                   "max_turns must be an int >= 1"):
        assert needle in text, (needle, text)


def test_a_tool_argument_model_comes_from_its_signature_and_docstring() -> None:
    from fsm_engine import Tool
    t = Tool(agent_machine.add)
    assert t.description == "Add two integers."
    assert t.schema()["required"] == ["a", "b"]
    assert t.validate({"a": "2", "b": 3}) == {"a": 2, "b": 3}
    with pytest.raises(ValueError, match="Extra inputs"):
        t.validate({"a": 1, "b": 2, "c": 3})
    sent = agent_machine.send_report
    assert sent.side_effect and sent.call_params == ("call",)
    assert list(sent.schema()["properties"]) == ["text"]


# -- operate: fork and replay ----------------------------------------------------------------

def test_fork_reuse_llm_replays_recorded_turns_and_never_redelivers(
        engine_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, sink = tmp_path / "tools.jsonl", tmp_path / "sink.jsonl"
    monkeypatch.setenv("AGENT_TOOL_LOG", str(log))
    monkeypatch.setenv("AGENT_SINK", str(sink))
    other = Scripted.from_replies([final("a different answer")])
    engine = engine_factory(llm=Scripted.from_replies(LOOP))
    orig = _run(engine, agent_machine.machine)
    engine.close()
    engine = engine_factory(llm=other)
    rows = engine.store.history(orig.id)
    second_turn = next(r.seq for r in rows if r.detail.get("agent") == "turn"
                       and r.detail["turn"] == 2)
    fid = engine.fork(orig.id, from_seq=second_turn, reuse_llm=True)
    rec = asyncio.run(engine.run(fid))
    assert (rec.state, rec.context) == ("answered", orig.context)
    assert other.calls == 0  # the final turn's prompt is byte-identical: its recorded reply
    ran = [json.loads(x)["tool"] for x in log.read_text().splitlines()]
    assert ran == ["add", "echo", "echo", "send_report", "echo"]  # only the unjournaled echo
    assert len(sink.read_text().splitlines()) == 1  # send_report: delivered by the original
    [call] = [r for r in engine.store.history(fid) if r.detail.get("tool") == "send_report"
              and r.detail.get("agent") == "call"]
    assert call.detail["delivered_by_original"] == f"{orig.id}:research:1:2:2.2"
    assert rec.tokens_used == orig.tokens_used - 20  # the final turn came back at 0 tokens
    unrun = engine.fork(orig.id, from_seq=second_turn)  # never run: it never made the call
    grand = engine.fork(unrun, from_seq=second_turn)  # a fork of a fork (issue 36 item 6)
    assert asyncio.run(engine.run(grand)).state == "answered"
    assert len(sink.read_text().splitlines()) == 1  # still delivered once, by the first
    [call] = [r for r in engine.store.history(grand) if r.detail.get("tool") == "send_report"
              and r.detail.get("agent") == "call"]
    assert call.detail["delivered_by_original"] == f"{orig.id}:research:1:2:2.2"


def test_replay_of_an_agent_history_is_identical(engine_factory: Any) -> None:
    from fsm_engine.runtime.kinds.replay import replay
    engine = engine_factory(llm=Scripted.from_replies(LOOP))
    rec = _run(engine, agent_machine.machine)
    cm = compile_machine(agent_machine.machine)
    history = engine.store.history(rec.id)
    report = replay(cm, rec, history, engine.store.attempts(rec.id))
    assert report.identical and report.steps == len(history)


def test_each_tool_call_is_an_execute_tool_span_under_its_step(db_path: str) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = Engine(db_path, llm=Scripted.from_replies(
        [calls(("add", {"a": 1, "b": 2}), ("boom", {})), final("3")]),
        tracer=provider.get_tracer("test"))
    try:
        _run(engine, agent_machine.machine)
    finally:
        engine.close()
        provider.shutdown()
    found = exporter.get_finished_spans()
    tools = [s for s in found if s.name.startswith("execute_tool")]
    assert [s.name for s in tools] == ["execute_tool add", "execute_tool boom"]
    assert tools[0].attributes["gen_ai.operation.name"] == "execute_tool"
    assert (tools[0].attributes["gen_ai.tool.name"], tools[0].attributes["gen_ai.tool.call.id"]) \
        == ("add", "1.1")
    assert "error.type" not in tools[0].attributes
    assert tools[1].attributes["error.type"] == "RuntimeError"
    steps = {s.context.span_id: s for s in found if s.name == "fsm.step"}
    assert all(t.parent is not None and t.parent.span_id in steps for t in tools)
    assert sum(s.name.startswith("chat ") for s in found) == 2


@pytest.mark.parametrize("level", ["instance", "state"])
def test_a_failed_turn_counts_against_the_budget_at_every_level(
        engine_factory: Any, level: str) -> None:
    """Issue 36 item 2: the tokens a failed turn was billed (retried) still count once a
    later turn is journaled: the same 2000 on the state refuses the third turn, as on the
    instance (400 + 1000 failed + 400 leave 200, the prompt needs ~300)."""
    from fsm_engine import RetryPolicy
    n = 2000
    m = Machine(name=f"agent-failed-turn-{level}", context=agent_machine.Ctx,
                initial="research", max_transitions=50,
                token_budget=n if level == "instance" else None, states=[
                    State("research", token_budget=n if level == "state" else None,
                          retry=RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=0.0),
                          agent=Agent(tools=agent_machine.TOOLS, output=agent_machine.Answer,
                                      max_turns=8)),
                    State("answered", final=True), State("out", final=True)],
                transitions=[Transition("done", "research", "answered"),
                             Transition("turns_exhausted", "research", "out"),
                             Transition("budget_exhausted", "research", "out")])
    model = Scripted.from_replies([
        calls(("add", {"a": 1, "b": 2}), tokens=200),
        {"text": "", "error": "http500", "prompt_tokens": 1000},
        calls(("add", {"a": 2, "b": 2}), tokens=200), final("4")])
    engine = engine_factory(llm=model)
    rec = _run(engine, m)
    [attempt] = engine.store.attempts(rec.id)
    assert attempt.tokens == 1000
    last = engine.store.history(rec.id)[-1]
    assert (rec.state, last.trigger, last.tokens) == ("out", "budget_exhausted", 0)
    assert f"200 of {n} left" in (last.error or "")
    assert model.calls == 3 and rec.tokens_used == 1800


def test_a_credential_in_a_tool_result_is_neither_stored_nor_shown_the_model() -> None:
    from fsm_engine.runtime.kinds.agent_tools import as_json
    value, error = as_json({"dsn": "postgresql://app:hunter2@db/x", "n": 1}, 1000)
    assert error is None and value == {"dsn": "postgresql://app@db/x", "n": 1}
    assert as_json(float("nan"), 1000)[1] is not None


def test_a_failed_turn_is_retried_under_the_state_retry_policy(engine_factory: Any) -> None:
    from fsm_engine import RetryPolicy
    m = Machine(name="agent-retry", context=agent_machine.Ctx, initial="research", states=[
        State("research", retry=RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=0.0),
              timeout=5, agent=Agent(tools=agent_machine.TOOLS, output=agent_machine.Answer)),
        State("answered", final=True), State("out", final=True)],
        transitions=[Transition("done", "research", "answered"),
                     Transition("turns_exhausted", "research", "out"),
                     Transition("budget_exhausted", "research", "out")])
    model = Scripted.from_replies([calls(("add", {"a": 1, "b": 1})),
                                   {"text": "", "error": "http500", "prompt_tokens": 7},
                                   final("2")])
    engine = engine_factory(llm=model)
    rec = _run(engine, m)
    assert (rec.state, rec.context["answer"]) == ("answered", "2")
    [attempt] = engine.store.attempts(rec.id)
    assert (attempt.error_class, attempt.tokens) == ("ServerError", 7)
    assert rec.tokens_used == 20 + 7 + 20


def test_min_calls_keeps_the_final_answer_out_until_a_tool_ran(engine_factory: Any) -> None:
    from fsm_engine.runtime.kinds.agent_journal import call_options
    m = agent_machine._machine("agent-min-calls", Agent(
        tools=agent_machine.TOOLS, output=agent_machine.Answer, min_calls=1))
    agent = m.state("research").agent
    assert agent is not None
    first = call_options(agent, None, final=False)["json_schema"]["anyOf"]
    assert all("tool" in b["properties"] for b in first)  # no final output in the union
    model = Scripted.from_replies([final("from memory"), calls(("add", {"a": 1, "b": 1})),
                                   final("2")])
    engine = engine_factory(llm=model)
    rec = _run(engine, m)
    assert (rec.state, rec.context["answer"]) == ("answered", "2")
    assert "call a tool first" in model.requests[1][-1]["content"]


def test_a_final_output_the_context_refuses_fails_the_instance_not_the_worker(
        engine_factory: Any) -> None:
    class Ctx(BaseModel):
        question: str
        answer: int = 0  # the output's answer is a string: the context refuses it

    class Out(BaseModel):
        answer: str
    m = Machine(name="agent-bad-output", context=Ctx, initial="research", states=[
        State("research", agent=Agent(tools=agent_machine.TOOLS, output=Out)),
        State("answered", final=True), State("out", final=True)],
        transitions=[Transition("done", "research", "answered"),
                     Transition("turns_exhausted", "research", "out"),
                     Transition("budget_exhausted", "research", "out")])
    engine = engine_factory(llm=Scripted.from_replies([final("not a number")]))
    rec = _run(engine, m)
    assert (rec.status, rec.reason) == ("failed", "invalid_update")
    assert "answer" in (rec.last_error or "")
