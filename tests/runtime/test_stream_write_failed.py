"""A stream write the store fails (a database restart, a dropped connection) mid-stream: the
call goes on, and once its reply is complete the whole of it is written again as a new
attempt that supersedes the one the failure left open (the matrix's finding S2,
``tests/integration/test_matrix.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from streamed_machine import CHUNKS, machine, rows, run

from fsm_engine import Engine
from fsm_engine.errors import StoreError
from fsm_engine.llm.scripted import Scripted
from fsm_engine.runtime.stream_read import events


def failing(engine: Engine, monkeypatch: pytest.MonkeyPatch, fail: set[int]) -> list[int]:
    """The store's stream writes numbered (1-based) in ``fail`` raise ``StoreError``;
    the list of the calls made so far (their numbers)."""
    real, calls = engine.store.stream_write, []

    def stream_write(ops: Any) -> Any:
        calls.append(len(calls) + 1)
        if calls[-1] in fail:
            raise StoreError("the database restarted")
        return real(ops)
    monkeypatch.setattr(engine.store, "stream_write", stream_write)
    return calls


def read(engine: Engine, iid: str) -> list[Any]:
    async def go() -> list[Any]:
        return [ev async for ev in events(engine.store, iid)]
    return asyncio.run(go())


@pytest.mark.parametrize("fail", [{2}, {1}])  # mid-stream; the write that opens the attempt
def test_a_failed_stream_write_is_followed_by_the_whole_reply_as_a_new_attempt(
        db_path, monkeypatch, fail: set[int]) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": CHUNKS, "chunk_delay_s": 0.05}]), seed=1)
    calls = failing(engine, monkeypatch, fail)
    iid, done = run(engine, machine())
    assert done.status == "completed" and len(calls) >= max(fail)  # (it failed)
    evs = read(engine, iid)
    n = max(e.attempt for e in evs if e.seq == 1)  # (2; 1 when nothing of the first landed)
    last = [e for e in evs if (e.seq, e.attempt) == (1, n)]
    assert [e.kind for e in last] == ["open", "chunk", "end"] and n == (1 if 1 in fail else 2)
    assert last[1].text == "".join(CHUNKS) and last[2].info["chars"] == len(last[1].text)
    first = [e for e in evs if (e.seq, e.attempt) == (1, 1)] if n == 2 else []
    if first:  # what the writes before the failure gave, then superseded by the new one
        assert "end" not in [e.kind for e in first] and first[-1].kind == "superseded"
        assert first[-1].by == (1, 2) and first[-1].offset < last[0].offset
    assert engine.store.history(iid)[0].detail["llm_calls"][0]["reply"] == "".join(CHUNKS)
    engine.close()


def test_a_store_failing_again_ends_the_writing_for_good(db_path, monkeypatch) -> None:
    """The reply is written again once: a store failing that write too is left alone (no
    loop of writes against a failing store; the history keeps the reply)."""
    from fsm_engine.runtime import streams
    monkeypatch.setattr(streams, "FLUSH_S", 0.0)  # each row by a batch, before the commit
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": CHUNKS, "chunk_delay_s": 0.05}]), seed=1)
    calls = failing(engine, monkeypatch, set(range(2, 100)))
    iid, done = run(engine, machine())
    assert done.status == "completed" and len(calls) in (2, 3)  # open, failed, (again)
    assert [r[2:4] for r in rows(engine, iid)][:2] == [(1, "open"), (1, "chunk")]
    assert engine.store.history(iid)[0].detail["llm_calls"][0]["reply"] == "".join(CHUNKS)
    engine.close()


def test_a_worker_that_lost_its_instance_writes_no_more_of_its_attempt(db_path,
                                                                        monkeypatch) -> None:
    """Taken over mid-stream (its lease lost, another worker the owner now): the rest of its
    attempt — pieces, its end or error — is refused by the store (``StreamOp.owner``), so
    the new owner's attempt is the last word (the matrix's finding S1)."""
    from dataclasses import replace

    from fsm_engine import State, Step, Transition
    from fsm_engine.runtime import streams
    from fsm_engine.store import StepCommit, open_store
    monkeypatch.setattr(streams, "FLUSH_S", 0.0)  # each piece by a batch, as it comes
    seen: list[int] = []

    async def taken_mid_stream(ctx: Any, step: Step) -> dict[str, Any]:
        reply = step.llm.stream([{"role": "user", "content": "go"}], max_tokens=32)
        async for piece in reply:
            if piece == CHUNKS[1]:
                while not engine.store.stream_read(step.instance_id):  # (a poll) written
                    await asyncio.sleep(0.005)
                other = open_store(db_path)
                rec = other.get(step.instance_id)
                assert other.commit([StepCommit(replace(rec, owner="w-new"), rec.version)])
                other.close()
                seen.append(len(engine.store.stream_read(step.instance_id)))
        return {"answer": "x"}
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": CHUNKS, "chunk_delay_s": 0.02}]), seed=1)
    from fsm_engine import Machine
    m = Machine(name="taken", context=machine().context, initial="ask", states=[
        State("ask", action=taken_mid_stream), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])
    iid = engine.start(m, {"topic": "cats"})
    asyncio.run(engine.run(iid))
    log = engine.store.stream_read(iid)
    assert seen and len(log) == seen[0]  # nothing more after the takeover
    assert "end" not in [r.kind for r in log] and engine.store.get(iid).owner == "w-new"
    engine.close()
