"""A short streamed call's rows left to its step's history (``runtime.stream_inline``): a
reader sees exactly the events the stream log would have given, after whatever the log
holds of the step, and a step that streamed slowly first and shortly then mixes both."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Step, Transition
from fsm_engine.llm.scripted import Scripted
from fsm_engine.runtime import stream_inline, streams
from fsm_engine.runtime.stream_read import events
from fsm_engine.store.records import StepCommit
from fsm_engine.store.streams import StreamOp, StreamRow


class Ctx(BaseModel):
    answer: str = ""


def collect(store: Any, iid: str, cursor: int | str = 0) -> list[Any]:
    async def go() -> list[Any]:
        return [ev async for ev in events(store, iid, cursor)]
    return asyncio.run(go())


def facts(evs: list[Any]) -> list[tuple[Any, ...]]:
    """What an event says, without where it sits (positions and cursors differ)."""
    return [(e.kind, e.seq, e.attempt, e.text, e.char_offset, e.partial, e.by, e.info,
             e.trigger) for e in evs]


async def three(ctx: Ctx, step: Step) -> dict[str, Any]:
    texts = [await step.llm.stream([{"role": "user", "content": str(n)}], max_tokens=32,
                                   **({"json_schema": {"type": "object"}} if n == 1 else {})
                                   ).text() for n in range(3)]
    return {"answer": "|".join(texts)}


def machine(action: Any) -> Machine:
    return Machine(name="inline", context=Ctx, initial="ask", states=[
        State("ask", action=action), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])


REPLIES = [{"chunks": ["a", "b"]}, {"chunks": ['{"k": ', '[1, 2]}']},
           {"chunks": ["x" * 9000, "y"]}]  # (longer than a row: split)


def test_inline_rows_read_as_the_log_would_have_given_them(db_path, monkeypatch) -> None:
    """The same history written the other way (its entries unmarked, their rows written
    to the log by ``stream_inline.ops``, after a crashed attempt of the step already in
    the log) reads as the same events as the inline one."""
    monkeypatch.setattr(streams, "FLUSH_S", 3600.0)  # no batch: by time or (below) by size
    monkeypatch.setattr(streams, "FLUSH_CHARS", 1 << 30)
    engine = Engine(db_path, llm=Scripted.from_replies(REPLIES), seed=1)
    store = engine.store
    crashed = StreamRow("", 1, 0, "chunk", "lost", 0, {}, 1.0)  # an attempt left open
    for iid in ("a", "b"):
        store.stream_write([StreamOp(iid, (dataclasses.replace(crashed, instance_id=iid),),
                                     True, 1, 1, {}, 1.0)])
    iid = engine.start(machine(three), {}, instance_id="a")
    asyncio.run(engine.run(iid))
    [h] = store.history("a")
    assert [c["stream"] for c in h.detail["llm_calls"]] == [
        {"json": False}, {"json": True}, {"json": False}]
    plain = copy.deepcopy(dataclasses.replace(h, instance_id="b"))
    for c in plain.detail["llm_calls"]:
        del c["stream"]
    store.create(dataclasses.replace(store.get("a"), id="b", key=None), history=[plain])
    store.stream_write(stream_inline.ops(StepCommit(store.get("b"), 0,
                                                    history=[dataclasses.replace(h, instance_id="b")])))
    inline, logged = collect(store, "a"), collect(store, "b")
    assert facts(inline) == facts(logged)
    assert [(e.kind, e.attempt) for e in inline if e.kind != "chunk"] == [
        ("open", 1), ("superseded", 1), ("open", 2), ("end", 2), ("superseded", 2),
        ("open", 3), ("end", 3), ("superseded", 3), ("open", 4), ("end", 4), ("step", 0),
        ("final", 0)]
    assert [e.partial for e in inline if e.kind == "chunk" and e.attempt == 3] == [{"k": [1, 2]}]
    assert [len(e.text) for e in inline if e.kind == "chunk" and e.attempt == 4] == [8192, 809]
    for n, ev in enumerate(inline[:-1]):  # resumable from every cursor, the inline ones too
        assert collect(store, "a", ev.cursor) == inline[n + 1:]
    engine.close()


WRITING: list[Any] = []  # the engine's batcher, for the action below


async def slow_then_short(ctx: Ctx, step: Step) -> dict[str, Any]:
    first = await step.llm.stream([{"role": "user", "content": "1"}], max_tokens=32).text()
    while WRITING[0].held:  # (a poll) until the first attempt's last rows are written
        await asyncio.sleep(0.005)
    streams.FLUSH_S = 3600.0  # (the test's monkeypatch restores it) no batch from here on
    second = await step.llm.stream([{"role": "user", "content": "2"}], max_tokens=32).text()
    return {"answer": first + "|" + second}


def test_a_short_call_after_a_logged_one_supersedes_it_from_the_history(db_path,
                                                                       monkeypatch) -> None:
    monkeypatch.setattr(streams, "FLUSH_S", 0.0)
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": ["a", "b"], "chunk_delay_s": 0.02}, {"chunks": ["c", "d"]}]), seed=1)
    WRITING[:] = [engine.driver.streams.batcher]
    iid = engine.start(machine(slow_then_short), {})
    assert asyncio.run(engine.run(iid)).context["answer"] == "ab|cd"
    log = engine.store.stream_read(iid)
    assert {r.attempt for r in log} == {1} and log[-1].kind == "end"  # only the first
    calls = engine.store.history(iid)[0].detail["llm_calls"]
    assert ["stream" in c for c in calls] == [False, True]
    evs = collect(engine.store, iid)
    assert [(e.kind, e.attempt, e.by) for e in evs if e.kind != "chunk"] == [
        ("open", 1, None), ("end", 1, None), ("superseded", 1, (1, 2)), ("open", 2, None),
        ("end", 2, None), ("step", 0, None), ("final", 0, None)]
    assert "".join(e.text for e in evs if e.attempt == 2) == "cd"
    engine.close()


async def one(ctx: Ctx, step: Step) -> dict[str, Any]:
    return {"answer": await step.llm.stream([{"role": "user", "content": "hi"}],
                                            max_tokens=8).text()}


def test_a_batch_due_while_the_breaker_records_the_call_leaves_its_rows_to_the_step(
        db_path, monkeypatch) -> None:
    """The circuit breaker records a call's outcome on a later turn of the event loop:
    after the provider's stream has ended, before the call returns.  A batch due in that
    turn (here: every turn) leaves the ending call's rows waiting, so its step's history
    holds them and the stream log gets no write of its own (W1 found one call in six
    written by a batch, 3 rows and a transaction each)."""
    monkeypatch.setattr(streams, "FLUSH_S", 0.0)
    engine = Engine(db_path, llm=Scripted.from_replies([{"text": "hello"}]), seed=1)
    assert engine.breaker_policy is not None  # (the default: one breaker per model)
    iid = engine.start(machine(one), {})
    rec = asyncio.run(engine.run(iid))
    assert rec.status == "completed" and rec.context["answer"] == "hello"
    [call] = [c for h in engine.store.history(iid) for c in h.detail.get("llm_calls", ())]
    assert call["stream"] == {"json": False}
    assert engine.store.stream_read(iid) == []
    assert [(e.kind, e.text) for e in collect(engine.store, iid) if e.kind != "step"] == [
        ("open", ""), ("chunk", "hello"), ("end", ""), ("final", "")]


def _writer(closed: bool) -> Any:
    """A writer of a step's call with one piece queued (its call ended when ``closed``)."""
    from fsm_engine.runtime.stream_writer import ChunkWriter
    w = ChunkWriter(streams.StreamTarget(None, "i", 1, 1, batcher=streams.Batcher(None)))
    w._pieces, w.chars, w._waiting = ["text"], 4, 4
    if closed:
        w._last, w.closed = ("end", {}, 0.0), True
    return w


def test_a_batch_spares_an_ended_call_once_then_writes_it() -> None:
    """A batch finding a call ended with nothing of it written leaves it to its step's
    commit; the next batch writes it (the action may still be running); an open call's
    pieces are written at once."""
    ended, open_ = _writer(closed=True), _writer(closed=False)
    assert streams._due([ended]) == ([], {ended: None})
    assert streams._due([ended]) == ([ended], {})
    assert streams._due([open_]) == ([open_], {})


class Seen(BaseModel):
    answer: str = ""
    rows_before_commit: int = 0


STORE: list[Any] = []


async def goes_on(ctx: Seen, step: Step) -> dict[str, Any]:
    """A streamed call, then more work before the step returns."""
    out = await step.llm.stream([{"role": "user", "content": "go"}], max_tokens=8).text()
    await asyncio.sleep(0.6)  # (twelve batch windows)
    return {"answer": out, "rows_before_commit": len(STORE[0].stream_read(step.instance_id))}


def test_an_ended_call_whose_action_goes_on_is_written_by_the_next_batch(
        db_path, monkeypatch) -> None:
    monkeypatch.setattr(streams, "FLUSH_S", 0.05)
    engine = Engine(db_path, llm=Scripted.from_replies([{"text": "hello"}]), seed=1)
    STORE[:] = [engine.store]
    m = Machine(name="goes_on", context=Seen, initial="ask", states=[
        State("ask", action=goes_on), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])
    rec = asyncio.run(engine.run(engine.start(m, {})))
    assert rec.status == "completed" and rec.context["answer"] == "hello"
    assert rec.context["rows_before_commit"] == 3  # open, chunk and end, before the commit
    assert [r.kind for r in engine.store.stream_read(rec.id)] == ["open", "chunk", "end"]
    engine.close()
