"""Agent turns stream (issue 36, "agent turns do not stream"): each model turn of an agent
state is a streamed call, its pieces in the stream log as a plain step's are (``fsm
stream``, the viewer), with a plain stream's guarantees: a turn cut mid-stream is superseded
by its retry, tokens are billed as for ``complete()``, the reply cache and a fork's recorded
replies answer a turn as one piece without calling the model; ``Agent(stream=False)`` turns
it off.  Scripted model, real SQLite files."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import agent_machine
import pytest
from agent_replies import LOOP
from cli import run_main

from fsm_engine import CachePolicy, Engine, Machine, RetryPolicy
from fsm_engine.llm import Scripted
from fsm_engine.llm.base import Completion, Provider
from fsm_engine.store.records import TOOL

Q = {"question": "what is 2 + 3?"}


def chunked(reply: dict[str, Any], size: int = 7, **extra: Any) -> dict[str, Any]:
    """``reply`` (an ``agent_replies`` line) served in pieces of ``size`` characters."""
    text = reply.get("text") or json.dumps({"tool_calls": reply["tool_calls"]},
                                           ensure_ascii=False)
    line = {k: v for k, v in reply.items() if k not in ("text", "tool_calls")}
    return {**line, "chunks": [text[n:n + size] for n in range(0, len(text), size)], **extra}


def _events(engine: Engine, iid: str) -> list[Any]:
    async def go() -> list[Any]:
        return [ev async for ev in engine.stream(iid)]
    return asyncio.run(go())


def _replies(engine: Engine, iid: str) -> dict[int, str]:
    """The reply each model turn's history row keeps, by the row's seq."""
    return {r.seq: r.detail["llm_calls"][-1]["reply"] for r in engine.store.history(iid)
            if r.detail.get("llm_calls")}


def _streamed(events: list[Any]) -> dict[tuple[int, int], str]:
    """Each attempt's streamed text, by ``(seq, attempt)``."""
    out: dict[tuple[int, int], str] = {}
    for e in events:
        if e.kind in ("open", "chunk"):
            out[(e.seq, e.attempt)] = out.get((e.seq, e.attempt), "") + e.text
    return out


def _agent(m: Machine, **options: Any) -> Machine:
    """``m`` with its agent state's ``Agent`` (and ``State``) given ``options``."""
    state = m.states[0]
    agent = state.agent
    assert agent is not None
    kw = {k: options.pop(k) for k in ("retry", "cache") if k in options}
    new = dataclasses.replace(state, agent=dataclasses.replace(agent, **options), **kw)
    return dataclasses.replace(m, states=[new, *m.states[1:]])


def test_each_agent_turn_streams_to_the_log_fsm_stream_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "fsm.db")
    engine = Engine(db, llm=Scripted.from_replies(
        [chunked(r, chunk_delay_s=0.001) for r in LOOP]), seed=1)
    iid = engine.start(agent_machine.machine, Q)
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.context["answer"]) == ("completed", "5")
    events = _events(engine, iid)
    replies = _replies(engine, iid)
    assert len(replies) == 3  # two turns journaled, the final one the transition
    # every turn streamed: one attempt per turn, its text the reply its row keeps
    assert _streamed(events) == {(seq, 1): text for seq, text in replies.items()}
    for seq in replies:  # the pieces come before the step that journals them, and end
        kinds = [e.kind for e in events if e.seq == seq and e.kind != "final"]
        assert kinds[0] == "open" and kinds[-2:] == ["end", "step"]
        assert len([k for k in kinds if k == "chunk"]) >= 1
    # the calls' rows follow the turn that chose them, as steps of their own
    steps = [(e.seq, e.trigger) for e in events if e.kind == "step"]
    assert [t for _, t in steps] == ["turn", "add", "echo", "turn", "echo", "send_report",
                                     "done"]
    assert rec.tokens_used == 60  # billed as complete() bills them
    engine.close()
    code, out, _ = run_main(["stream", iid, "--db", db, "--json"], capsys)
    assert code == 0
    lines = [json.loads(x) for x in out.splitlines()]
    text = "".join(e.get("text", "") for e in lines if e["kind"] == "chunk")
    assert text == "".join(replies.values())
    for seq, reply in replies.items():  # a JSON reply: its object as parsed so far
        last = [e for e in lines if e["kind"] == "chunk" and e["seq"] == seq][-1]
        assert last["partial"] == json.loads(reply)


def test_stream_false_turns_it_off_and_the_history_is_the_same(tmp_path: Path) -> None:
    runs = []
    for stream in (True, False):
        engine = Engine(str(tmp_path / f"{stream}.db"), llm=Scripted.from_replies(LOOP), seed=1)
        iid = engine.start(_agent(agent_machine.machine, stream=stream), Q, instance_id="a1")
        rec = asyncio.run(engine.run(iid))
        rows = [(r.kind, r.trigger, r.tokens, r.detail.get("calls"), r.detail.get("reply"))
                for r in engine.store.history(iid)]
        keys = [r.detail["llm_calls"][0]["key"] for r in engine.store.history(iid)
                if r.detail.get("llm_calls")]
        runs.append((rec.context, rec.tokens_used, rows, keys,
                     [e.kind for e in _events(engine, iid) if e.kind in ("open", "chunk")]))
        engine.close()
    (ctx, tokens, rows, keys, streamed), (ctx2, tokens2, rows2, keys2, quiet) = runs
    assert (ctx, tokens, rows, keys) == (ctx2, tokens2, rows2, keys2)
    assert streamed and not quiet
    assert "stream" not in agent_machine.machine.states[0].agent.export()  # no new version


def test_a_turn_cut_mid_stream_is_superseded_by_its_retry(tmp_path: Path) -> None:
    cut = chunked(LOOP[0], chunk_delay_s=0.001)
    cut = {**cut, "chunks": cut["chunks"][:3], "error": "http500"}
    engine = Engine(str(tmp_path / "fsm.db"), llm=Scripted.from_replies(
        [cut, *(chunked(r, chunk_delay_s=0.001) for r in LOOP)]), seed=1)
    m = _agent(agent_machine.machine, retry=RetryPolicy(max_attempts=2, initial_interval=0.0,
                                                        jitter=0.0))
    iid = engine.start(m, Q)
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.context["answer"]) == ("completed", "5")
    events = _events(engine, iid)
    [gone] = [e for e in events if e.kind == "superseded"]
    assert (gone.seq, gone.attempt, gone.by) == (1, 1, (1, 2))
    first = [e.kind for e in events if (e.seq, e.attempt) == (1, 1)]
    assert "end" not in first and first[-2:] == ["error", "superseded"]
    assert _streamed(events)[(1, 1)] == "".join(cut["chunks"])
    assert _streamed(events)[(1, 2)] == _replies(engine, iid)[1]
    assert rec.tokens_used == 60 + 20  # the cut turn's tokens billed too
    engine.close()


def test_cached_and_replayed_turns_stream_as_one_piece_without_the_model(
        tmp_path: Path) -> None:
    model = Scripted.from_replies([chunked(r) for r in LOOP])
    engine = Engine(str(tmp_path / "fsm.db"), llm=model, seed=1)
    m = _agent(agent_machine.machine, cache=CachePolicy(ttl_s=600))
    asyncio.run(engine.run(engine.start(m, Q)))
    assert model.calls == 3
    again = engine.start(m, Q)
    rec = asyncio.run(engine.run(again))
    assert model.calls == 3 and rec.tokens_used == 0  # every turn from the cache
    events = _events(engine, again)
    replies = _replies(engine, again)
    assert [e.text for e in events if e.kind == "chunk"] == list(replies.values())
    fork = engine.fork(again, from_seq=0, reuse_llm=True)
    forked = asyncio.run(engine.run(fork))
    assert model.calls == 3 and forked.context == rec.context
    assert [e.text for e in _events(engine, fork) if e.kind == "chunk"] == list(
        _replies(engine, fork).values())
    assert all(r.detail["llm_calls"][0].get("replayed") for r in engine.store.history(fork)
               if r.detail.get("llm_calls"))
    assert [r.detail["agent"] for r in engine.store.history(fork) if r.kind == TOOL][:1] == [
        "turn"]
    engine.close()


class ToolsWhole(Provider):
    """A provider speaking OpenAI tool calling whose ``stream`` cannot take ``tools``."""

    name, model = "whole", "m"
    supports_tools = True

    def __init__(self) -> None:
        self.texts = [r.get("text") or json.dumps({"tool_calls": r["tool_calls"]})
                      for r in LOOP]
        self.asked: list[dict[str, Any]] = []

    async def complete(self, messages: list[Any], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: Any = None,
                       stop: list[str] | None = None, tools: Any = None,
                       tool_choice: str | None = None) -> Completion:
        self.asked.append({"tools": bool(tools)})
        return Completion(self.texts[len(self.asked) - 1], 10, 10, "stop", self.model)

    async def stream(self, messages: list[Any], *, max_tokens: int = 256,
                     temperature: float = 0.0, json_schema: Any = None,
                     stop: list[str] | None = None) -> AsyncIterator[Any]:
        raise AssertionError("a call with tools must not reach this stream")
        yield ""  # (an async generator)


def test_a_provider_that_cannot_stream_tool_calls_is_asked_whole_and_streamed_as_one_piece(
        tmp_path: Path) -> None:
    model = ToolsWhole()
    engine = Engine(str(tmp_path / "fsm.db"), llm=model, seed=1)
    iid = engine.start(agent_machine.machine, Q)
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.context["answer"]) == ("completed", "5")
    assert model.asked == [{"tools": True}] * 3 and rec.tokens_used == 60
    events = _events(engine, iid)
    replies = _replies(engine, iid)
    assert [(e.seq, e.text) for e in events if e.kind == "chunk"] == list(replies.items())
    engine.close()


def test_fsm_stream_shows_each_tool_calls_result_after_the_turn_that_chose_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "fsm.db")
    engine = Engine(db, llm=Scripted.from_replies([
        chunked({"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                                {"name": "nope", "arguments": {}},
                                {"name": "echo", "arguments": {"text": "\u202e" + "x" * 900}}]}),
        chunked(LOOP[2])]), seed=1)
    iid = engine.start(agent_machine.machine, Q)
    asyncio.run(engine.run(iid))
    steps = [e for e in _events(engine, iid) if e.kind == "step"]
    engine.close()
    assert [(e.trigger, e.info) for e in steps][:3] == [
        ("turn", {}), ("add", {"call": "1.1", "result": "5"}),
        ("nope", {"call": "1.2", "error": "unknown tool 'nope'; the tools are add, echo, "
                                          "send_report, boom, huge, opaque, flaky, stall, "
                                          "stall_sync"})]
    assert len(steps[3].info["result"]) == 300  # cut
    code, out, _ = run_main(["stream", iid, "--db", db], capsys)
    assert code == 0
    lines = out.splitlines()
    turn = lines.index("[step 1: research --turn--> research]")
    assert lines[turn - 2].startswith('{"tool_calls": [{"name": "add"')  # the turn, streamed
    assert lines[turn + 1] == "[step 2: research --add--> research] = 5"
    assert lines[turn + 2].startswith("[step 3: research --nope--> research] failed: unknown")
    assert "\u202e" not in out  # stored text printed as text, never as terminal controls
