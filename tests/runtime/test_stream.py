"""Streaming a model's reply (issue 22), in one process: the scripted provider's chunks, the
call layers applied to a streamed call, the durable log's attempts and supersessions, and
``engine.stream``'s merged events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel
from streamed_machine import CHUNKS, Ctx, ask, machine, rows, run

from fsm_engine import CachePolicy, Engine, Machine, State, Step, Transition
from fsm_engine.errors import FsmError, InstanceNotFound, InvalidInput, ProviderTimeout
from fsm_engine.llm.base import Completion
from fsm_engine.llm.scripted import Scripted
from fsm_engine.policies import RetryPolicy


def collect(engine: Engine, iid: str, from_offset: int | str = 0) -> list[Any]:
    async def go() -> list[Any]:
        return [ev async for ev in engine.stream(iid, from_offset)]
    return asyncio.run(go())


def test_scripted_chunks_stream_in_order_then_the_completion() -> None:
    """Chunks ``chunk_delay_s`` apart come one by one; with no delay they arrive together,
    as one list (the events of one network read)."""
    llm = Scripted.from_replies([{"chunks": CHUNKS, "completion_tokens": 5,
                                  "chunk_delay_s": 0.001},
                                 {"chunks": CHUNKS, "completion_tokens": 5}])

    async def go() -> list[Any]:
        return [p async for p in llm.stream([{"role": "user", "content": "x"}])]
    *pieces, done = asyncio.run(go())
    assert pieces == CHUNKS and done.text == "".join(CHUNKS) and done.completion_tokens == 5
    *pieces, done = asyncio.run(go())
    assert pieces == [CHUNKS] and done.text == "".join(CHUNKS)
    with pytest.raises(InvalidInput, match="concatenation"):
        Scripted.from_replies([{"chunks": ["a", "b"], "text": "abc"}])
    with pytest.raises(InvalidInput, match="list of strings"):
        Scripted.from_replies([{"chunks": "ab"}])


def test_pieces_that_arrive_together_reach_the_action_one_by_one_and_the_log_whole(
        db_path) -> None:
    """The provider hands the step's call a list (chunks with no delay between them): the
    action's ``async for`` still gets each piece, and the log and history hold the reply."""
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS}]), seed=1)
    iid, done = run(engine, machine())
    assert done.context["seen"] == CHUNKS and done.context["answer"] == "".join(CHUNKS)
    got = collect(engine, iid)
    assert "".join(e.text for e in got if e.kind == "chunk") == "".join(CHUNKS)
    assert [e.kind for e in got][-3:] == ["end", "step", "final"]
    engine.close()


def test_a_streamed_step_writes_its_chunks_and_the_history_keeps_the_reply(db_path) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": CHUNKS, "prompt_tokens": 7, "completion_tokens": 5,
         "chunk_delay_s": 0.03}]), seed=1)  # (slower than a batch: the log is written)
    iid, done = run(engine, machine())
    assert done.context["seen"] == CHUNKS and done.context["answer"] == "".join(CHUNKS)
    log = rows(engine, iid)
    assert [r[3] for r in log][0] == "open" and log[-1][3] == "end"
    assert [r[0] for r in log] == list(range(len(log)))  # positions without gaps
    chunks = [r for r in log if r[3] == "chunk"]
    assert "".join(r[4] for r in chunks) == "".join(CHUNKS)
    assert [r[5] for r in chunks] == [sum(len(c[4]) for c in chunks[:i]) for i in range(len(chunks))]
    assert {(r[1], r[2]) for r in log} == {(1, 1)}
    [row] = engine.store.history(iid)
    assert row.detail["llm_calls"][0]["reply"] == "".join(CHUNKS) and row.tokens == 12
    engine.close()


def test_engine_stream_merges_chunks_steps_and_the_final_status(db_path) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS,
                                                         "chunk_delay_s": 0.03}]), seed=1)
    iid, _ = run(engine, machine())
    events = collect(engine, iid)
    kinds = [e.kind for e in events]
    assert kinds[0] == "open" and kinds[-3:] == ["end", "step", "final"]
    step = events[-2]
    assert (step.seq, step.source, step.trigger, step.dest) == (1, "ask", "ok", "done")
    assert events[-1].status == "completed"
    text = "".join(e.text for e in events if e.kind == "chunk")
    assert text == "".join(CHUNKS)
    # resuming from any event's cursor gives exactly the events after it
    for n, ev in enumerate(events[:-1]):
        assert collect(engine, iid, ev.cursor) == events[n + 1:]
    # a bare offset resumes the log there (the step's commit comes again: at least once)
    assert collect(engine, iid, 2) == events[2:]
    with pytest.raises(InstanceNotFound):
        collect(engine, "nope")
    with pytest.raises(InvalidInput, match="bad stream offset"):
        collect(engine, iid, "x:1")
    engine.close()


def test_a_cached_reply_is_replayed_as_one_chunk(db_path) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": CHUNKS, "prompt_tokens": 3, "completion_tokens": 5}]), seed=1)
    m = machine(cache=CachePolicy(ttl_s=60))
    run(engine, m)
    iid, done = run(engine, m)
    assert done.tokens_used == 0 and done.context["seen"] == ["".join(CHUNKS)]
    assert [(e.kind, e.text) for e in collect(engine, iid)][:3] == [
        ("open", ""), ("chunk", "".join(CHUNKS)), ("end", "")]
    assert engine.store.history(iid)[0].detail["llm_calls"][0]["cached"] is True
    engine.close()


def test_a_failed_attempt_is_superseded_by_the_retry(db_path) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": ["half ", "a rep"], "error": "timeout"}, {"chunks": CHUNKS}]), seed=1)
    iid, done = run(engine, machine(retry=RetryPolicy(max_attempts=2, initial_interval=0.0)))
    assert done.status == "completed" and done.context["answer"] == "".join(CHUNKS)
    events = collect(engine, iid)
    first = [e for e in events if e.attempt == 1]
    kinds = [e.kind for e in first]  # (pieces batch as the writes allow)
    assert kinds[0] == "open" and kinds[-2:] == ["error", "superseded"]
    assert set(kinds[1:-2]) == {"chunk"}
    assert "".join(e.text for e in first if e.kind == "chunk") == "half a rep"
    [gone] = [e for e in events if e.kind == "superseded"]
    assert (gone.seq, gone.attempt, gone.by) == (1, 1, (1, 2))
    assert [e.info.get("error") for e in events if e.kind == "error"] == [ProviderTimeout.__name__]
    second = "".join(e.text for e in events if e.kind == "chunk" and e.attempt == 2)
    assert second == engine.store.history(iid)[0].detail["llm_calls"][-1]["reply"]
    engine.close()


class Verdict(BaseModel):
    decision: str
    reasons: list[str]


class VCtx(BaseModel):
    verdict: dict[str, Any] = {}


async def judge(ctx: VCtx, step: Step) -> dict[str, Any]:
    parsed = await step.llm.structured([{"role": "user", "content": "judge"}], Verdict,
                                       stream=True, max_tokens=64)
    return {"verdict": parsed.value.model_dump()}


def test_a_reask_after_invalid_json_supersedes_the_first_answer(db_path) -> None:
    good = '{"decision": "approve", "reasons": ["clear", "kind"]}'
    engine = Engine(db_path, llm=Scripted.from_replies([
        {"chunks": ['{"decision": ', '"appr']},  # cut: invalid JSON
        {"chunks": [good[:12], good[12:30], good[30:]], "chunk_delay_s": 0.03}]), seed=1)
    m = Machine(name="judged", context=VCtx, initial="judge", states=[
        State("judge", action=judge), State("done", final=True)],
        transitions=[Transition("ok", "judge", "done")])
    iid = engine.start(m, {})
    done = asyncio.run(engine.run(iid))
    assert done.context["verdict"] == json.loads(good)
    events = collect(engine, iid)
    [gone] = [e for e in events if e.kind == "superseded"]
    assert (gone.attempt, gone.by) == (1, (1, 2))
    ends = [e.attempt for e in events if e.kind == "end"]
    assert ends == [1, 2]  # the first ended (its text was whole) and was still replaced
    partials = [e.partial for e in events if e.kind == "chunk" and e.attempt == 2]
    assert partials[-1] == json.loads(good)
    final = json.loads(good)
    for p in partials:  # each the object decided so far: whole fields, lists growing
        assert isinstance(p, dict)
        for k, v in p.items():
            assert v == (final[k][:len(v)] if isinstance(v, list) else final[k])
    assert [e.info for e in events if e.kind == "open"] == [{"json": True}] * 2
    engine.close()


def test_a_budget_refuses_a_streamed_call_before_anything_is_sent(db_path) -> None:
    llm = Scripted.from_replies([{"chunks": CHUNKS, "prompt_tokens": 7, "completion_tokens": 5}])
    engine = Engine(db_path, llm=llm, seed=1)
    iid = engine.start(machine(), {"topic": "cats" * 50}, token_budget=5)
    done = asyncio.run(engine.run(iid))
    assert (done.status, done.reason, done.tokens_used, llm.calls) == ("failed", "token_budget",
                                                                       0, 0)
    log = engine.store.stream_read(iid)
    assert [(r.kind, r.info.get("error")) for r in log] == [
        ("open", None), ("error", "BudgetExhausted")]  # an attempt that never wrote a word
    engine.close()


def test_a_fork_reusing_the_model_replays_the_recorded_reply_as_its_stream(db_path) -> None:
    llm = Scripted.from_replies([{"chunks": CHUNKS, "prompt_tokens": 7, "completion_tokens": 5}])
    engine = Engine(db_path, llm=llm, seed=1)
    iid, _ = run(engine, machine())
    fork = engine.fork(iid, from_seq=0, reuse_llm=True)
    done = asyncio.run(engine.run(fork))
    assert (done.tokens_used, llm.calls) == (0, 1)  # nothing sent for the fork
    assert done.context["seen"] == ["".join(CHUNKS)]
    assert [(e.kind, e.text) for e in collect(engine, fork)][:3] == [
        ("open", ""), ("chunk", "".join(CHUNKS)), ("end", "")]
    assert engine.store.history(fork)[-1].detail["llm_calls"][0]["replayed"] is True
    engine.close()


def test_fsm_stream_prints_the_reply_and_refuses_bad_input_in_one_line(db_path, capsys) -> None:
    from cli import run_main
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS}]), seed=1)
    iid, _ = run(engine, machine())
    engine.close()
    code, out, err = run_main(["stream", iid[:6], "--db", db_path], capsys)
    assert code == 0, err
    assert "".join(CHUNKS) in out and out.rstrip().endswith("[completed]")
    assert "[step 1: ask --ok--> done]" in out
    code, out, _ = run_main(["stream", iid, "--db", db_path, "--json", "--from", "0:0:1"], capsys)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and lines[0]["kind"] == "chunk" and lines[-1]["kind"] == "final"
    for argv, needle in ((["stream", "nope", "--db", db_path], "nope"),
                         (["stream", iid, "--db", db_path, "--from", "-3"], "bad stream offset"),
                         (["stream", iid, "--db", db_path, "--from", "9223372036854775808"],
                          "bad stream offset")):
        code, out, err = run_main(argv, capsys)
        lines = err.strip().splitlines()
        assert (code, out) == (2, "") and len(lines) == 1, err
        assert lines[0].startswith("fsm: error: ") and needle in lines[0], err


def test_on_postgres_a_read_only_subscriber_is_woken_by_notify(pg_cluster) -> None:
    from fsm_engine.runtime.stream_read import events
    from fsm_engine.store import open_store
    url = pg_cluster.database()
    engine = Engine(url, llm=Scripted.from_replies([{"chunks": CHUNKS, "chunk_delay_s": 0.03}]),
                    seed=1)
    iid = engine.start(machine(), {"topic": "pg"})
    viewer = open_store(url, readonly=True)

    async def go() -> list[Any]:
        async def watch() -> list[Any]:
            return [ev async for ev in events(viewer, iid)]
        seen, _ = await asyncio.gather(watch(), engine.run(iid))
        return seen
    try:
        seen = asyncio.run(go())
        assert [e.kind for e in seen][-3:] == ["end", "step", "final"]
        assert "".join(e.text for e in seen if e.kind == "chunk") == "".join(CHUNKS)
        assert [e.offset for e in seen if e.kind not in ("step", "final")] == list(
            range(len(seen) - 2))
        assert seen == collect(engine, iid)  # the same events read again afterwards
    finally:
        viewer.close()
        engine.close()


def test_a_step_timeout_mid_stream_marks_the_attempt_and_the_retry_supersedes_it(
        db_path) -> None:
    slow = {"chunks": [f"p{i} " for i in range(40)], "chunk_delay_s": 0.05}
    engine = Engine(db_path, llm=Scripted.from_replies([slow, {"chunks": CHUNKS}]), seed=1)
    m = machine(timeout=0.3, retry=RetryPolicy(max_attempts=2, initial_interval=0.0))
    iid, done = run(engine, m)
    assert done.status == "completed" and done.context["answer"] == "".join(CHUNKS)
    events = collect(engine, iid)
    first = [e for e in events if (e.seq, e.attempt) == (1, 1)]
    kinds = [e.kind for e in first]
    assert kinds[0] == "open" and "end" not in kinds  # cut by the timeout: never complete
    assert ("error", "cancelled") in [(e.kind, e.info.get("error")) for e in first]
    assert [e.by for e in first if e.kind == "superseded"] == [(1, 2)]
    cut = "".join(e.text for e in first if e.kind == "chunk")
    assert cut and "".join(slow["chunks"]).startswith(cut) and cut != "".join(slow["chunks"])
    assert [e.kind for e in events if e.attempt == 2][-1] == "end"
    engine.close()


def test_fault_injection_applies_to_a_streamed_call(db_path) -> None:
    from fsm_engine.llm import FaultInjector
    inner = Scripted.from_replies([{"chunks": ['{"a": ', '1}'], "completion_tokens": 2}])
    engine = Engine(db_path, llm=FaultInjector(inner, {"fenced": 1.0}, seed=1), seed=1)
    iid, done = run(engine, machine())
    fenced = done.context["answer"]
    assert fenced != '{"a": 1}' and '{"a": 1}' in fenced  # the fault's distortion
    assert done.context["seen"] == [fenced]  # a provider that cannot stream: one piece
    assert "".join(e.text for e in collect(engine, iid) if e.kind == "chunk") == fenced
    engine.close()


def test_an_injected_http500_cuts_a_streamed_reply_and_the_retry_supersedes_it(db_path) -> None:
    from fsm_engine.llm import FaultInjector
    inner = Scripted.from_replies([{"chunks": CHUNKS, "completion_tokens": 5}])
    faults = FaultInjector(inner, {"http500": 0.5}, seed=3)
    engine = Engine(db_path, llm=faults, seed=1)
    iid, done = run(engine, machine(retry=RetryPolicy(max_attempts=6, initial_interval=0.0)))
    assert done.status == "completed" and faults.faults["http500"] >= 1
    events = collect(engine, iid)
    cut = [e for e in events if e.kind == "error"]
    assert [e.info["error"] for e in cut] == ["ServerError"] * faults.faults["http500"]
    for e in cut:  # each cut attempt streamed the pieces, then was superseded, never ended
        mine = [x for x in events if (x.seq, x.attempt) == (e.seq, e.attempt)]
        assert "".join(x.text for x in mine if x.kind == "chunk") == "".join(CHUNKS)
        assert "end" not in [x.kind for x in mine] and "superseded" in [x.kind for x in mine]
    assert done.tokens_used == faults.total_tokens  # usage billed through the errors too
    engine.close()


def test_a_subscription_in_the_engines_own_process_follows_the_run_live(db_path) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS, "chunk_delay_s": 0.03}]),
                    seed=1)
    iid = engine.start(machine(), {"topic": "live"})
    states: list[int] = []

    async def go() -> list[Any]:
        async def watch() -> list[Any]:
            seen = []
            async for ev in engine.stream(iid):
                if ev.kind == "chunk":
                    states.append(engine.store.get(iid).seq)  # committed steps at that moment
                seen.append(ev)
            return seen
        seen, _ = await asyncio.gather(watch(), engine.run(iid))
        return seen
    seen = asyncio.run(go())
    assert states[0] == 0  # text arrived while the step was still running
    assert "".join(e.text for e in seen if e.kind == "chunk") == "".join(CHUNKS)
    assert [e.kind for e in seen][-2:] == ["step", "final"]
    engine.close()


async def twice(ctx: Ctx, step: Step) -> dict[str, Any]:
    first = await step.llm.stream([{"role": "user", "content": "one"}], max_tokens=32).text()
    second = await step.llm.stream([{"role": "user", "content": "two"}], max_tokens=32).text()
    return {"answer": first + "|" + second}


def twice_machine() -> Machine:
    return Machine(name="twice", context=Ctx, initial="ask", states=[
        State("ask", action=twice), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])


def test_a_short_streamed_call_leaves_its_rows_to_its_steps_history(db_path, monkeypatch) -> None:
    """A call that ended before any batch writes no stream row: its ``llm_calls`` entry is
    marked and a reader shows it as the rows it stands for, resumable from every cursor."""
    from fsm_engine.runtime import streams
    monkeypatch.setattr(streams, "FLUSH_S", 3600.0)  # no batch comes before the commit
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS}]), seed=1)
    iid, done = run(engine, machine())
    batcher = engine.driver.streams.batcher
    assert (done.status, batcher.batches, batcher.held) == ("completed", 0, {})
    assert rows(engine, iid) == []
    [call] = engine.store.history(iid)[0].detail["llm_calls"]
    assert call["stream"] == {"json": False} and call["reply"] == "".join(CHUNKS)
    events = collect(engine, iid)
    assert [(e.kind, e.seq, e.attempt, e.text, e.char_offset, e.offset) for e in events] == [
        ("open", 1, 1, "", 0, 0), ("chunk", 1, 1, "".join(CHUNKS), 0, 0),
        ("end", 1, 1, "", 0, 0), ("step", 1, 0, "", 0, 0), ("final", 1, 0, "", 0, 0)]
    assert events[2].info == {"finish": "stop", "chars": len("".join(CHUNKS))}
    assert [e.cursor for e in events] == ["0:0:1", "0:0:2", "0:0:3", "0:1", "0:1:0"]
    for n, ev in enumerate(events[:-1]):  # no gap, no duplicate from any cursor
        assert collect(engine, iid, ev.cursor) == events[n + 1:]
    for bad in ("1:2:3:4", "0::1", "9223372036854775808", "0:1:99999999999999999999",
                "²", "9" * 5000):  # (past a 64-bit integer: sqlite3 raised OverflowError; 5,000
        # digits: int() raised its own ValueError)
        with pytest.raises(InvalidInput, match="bad stream offset"):
            collect(engine, iid, bad)
    engine.close()


def test_a_second_streamed_call_of_a_step_comes_after_the_first_in_the_log(
        db_path, monkeypatch) -> None:
    from fsm_engine.runtime import streams
    replies = [{"chunks": ["a", "b"]}, {"chunks": ["c", "d"], "chunk_delay_s": 0.01}]
    for flush in (3600.0, 0.0):  # both held for the commit; written by batches as they go
        monkeypatch.setattr(streams, "FLUSH_S", flush)
        engine = Engine(db_path, llm=Scripted.from_replies(replies), seed=1)
        iid, done = run(engine, twice_machine())
        assert done.context["answer"] == "ab|cd"
        log = collect(engine, iid)[:-2]  # (the step and the final status after)
        assert [(r.attempt, r.kind) for r in log if r.kind != "chunk"] == [
            (1, "open"), (1, "end"), (1, "superseded"), (2, "open"), (2, "end")]
        for attempt, text in ((1, "ab"), (2, "cd")):
            mine = [r for r in log if r.attempt == attempt and r.kind == "chunk"]
            assert "".join(r.text for r in mine) == text
            assert [r.char_offset for r in mine] == [sum(len(r.text) for r in mine[:i])
                                                     for i in range(len(mine))]
        assert (engine.driver.streams.batcher.batches > 0) == (flush == 0.0)
        assert bool(engine.store.stream_read(iid)) == (flush == 0.0)  # (held: left inline)
        engine.close()


def test_text_a_commit_cannot_carry_is_written_by_a_batch_first(db_path) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": ["a\x00b", "c"]}]), seed=1)
    iid, done = run(engine, machine())
    assert done.context["answer"] == "a\x00bc" and engine.driver.streams.batcher.batches >= 1
    assert [(r.kind, r.text) for r in engine.store.stream_read(iid)] == [
        ("open", ""), ("chunk", "a\x00bc"), ("end", "")]
    engine.close()


class _Late:
    """A store as a reader saw it just before a step's commit that carried its log rows:
    its first log read finds none."""

    def __init__(self, store: Any) -> None:
        self.store, self.hidden = store, True

    def stream_read(self, instance_id: str, from_pos: int = 0, limit: int = 500) -> Any:
        if self.hidden:
            self.hidden = False
            return []
        return self.store.stream_read(instance_id, from_pos, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_rows_committed_with_a_step_are_delivered_before_it(db_path) -> None:
    from fsm_engine.runtime.stream_read import events
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS}]), seed=1)
    iid, _ = run(engine, machine())

    async def go() -> list[Any]:
        return [ev async for ev in events(_Late(engine.store), iid)]
    late = asyncio.run(go())
    assert [e.kind for e in late][-3:] == ["end", "step", "final"]
    assert late == collect(engine, iid)
    engine.close()


def test_on_postgres_a_short_streamed_call_leaves_its_rows_to_its_history(pg_cluster, monkeypatch) -> None:
    from fsm_engine.runtime import streams
    monkeypatch.setattr(streams, "FLUSH_S", 3600.0)
    engine = Engine(pg_cluster.database(), llm=Scripted.from_replies([{"chunks": CHUNKS}]),
                    seed=1)
    try:
        iid, done = run(engine, twice_machine())
        assert done.status == "completed" and engine.driver.streams.batcher.batches == 0
        assert engine.store.stream_read(iid) == []  # left to the step's history
        assert [(e.attempt, e.kind) for e in collect(engine, iid)] == [
            (1, "open"), (1, "chunk"), (1, "end"), (1, "superseded"), (2, "open"),
            (2, "chunk"), (2, "end"), (0, "step"), (0, "final")]
    finally:
        engine.close()


def test_rows_a_finished_event_loop_left_waiting_are_dropped_by_the_next(tmp_path) -> None:
    from fsm_engine.runtime.stream_writer import ChunkWriter
    from fsm_engine.runtime.streams import Batcher, StreamTarget
    from fsm_engine.store import open_store
    store = open_store(str(tmp_path / "x.db"))
    batcher = Batcher(store)
    to = StreamTarget(store, "a", 1, 1, batcher=batcher)

    async def cut() -> None:  # the loop ends before any batch or commit
        ChunkWriter(to).add("never written")

    async def commit() -> Any:
        return batcher.tail("a")
    asyncio.run(cut())
    assert list(batcher.held) == ["a"]
    assert asyncio.run(commit()) == () and batcher.held == {}
    assert store.stream_read("a") == []
    store.close()


async def ask_then_refused(ctx: Ctx, step: Step) -> dict[str, Any]:
    out = await ask(ctx, step)
    step.notes["callback"] = print  # no JSON form: with the driver's check off, the store refuses
    return out


def test_a_step_the_store_refuses_keeps_its_streamed_reply_in_the_log(
        db_path, monkeypatch) -> None:
    """The streamed rows a refused step carried go with its failure's commit: the attempt
    reads complete, its text whole, and the instance failed ``store_rejected``."""
    from fsm_engine.runtime import streams, values
    monkeypatch.setattr(streams, "FLUSH_S", 3600.0)  # the rows ride the step's commit
    monkeypatch.setattr(values, "check_json", lambda data, path="": None)
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS}]), seed=1)
    m = Machine(name="refused", context=Ctx, initial="ask", states=[
        State("ask", action=ask_then_refused), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])
    iid, done = run(engine, m)
    assert (done.status, done.reason) == ("failed", "store_rejected")
    assert [r[2:] for r in rows(engine, iid)] == [
        (1, "open", "", 0), (1, "chunk", "".join(CHUNKS), 0), (1, "end", "", 0)]
    engine.close()


def test_a_store_refusing_the_streamed_rows_too_still_records_the_failure(
        db_path, monkeypatch) -> None:
    """Refused with its rows and refused again with them on the failure: the failure is
    committed alone (the attempt's rows are lost, never the instance's end)."""
    from fsm_engine.errors import StepRejected
    from fsm_engine.runtime import streams
    monkeypatch.setattr(streams, "FLUSH_S", 3600.0)
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS}]), seed=1)
    real = engine.store.commit

    def refuse_streams(steps: Any) -> Any:  # the step (its calls' rows inline), then them
        for i, s in enumerate(steps):
            if s.stream or any("llm_calls" in h.detail for h in s.history):
                raise StepRejected("no stream rows here", index=i)
        return real(steps)
    monkeypatch.setattr(engine.store, "commit", refuse_streams)
    iid, done = run(engine, machine())
    assert (done.status, done.reason) == ("failed", "store_rejected")
    assert engine.store.get(iid).status == "failed" and rows(engine, iid) == []
    engine.close()


async def side_by_side(ctx: Ctx, step: Step) -> dict[str, Any]:
    """Two streamed calls of one step at once (``text``): the first begun answers later."""
    first = step.llm.stream([{"role": "user", "content": "first"}], max_tokens=8)
    second = step.llm.stream([{"role": "user", "content": "second"}], max_tokens=8)
    a, b = await asyncio.gather(first.text(), second.text())
    return {"answer": f"{a}|{b}"}


def test_calls_of_one_step_are_numbered_in_the_order_they_began_not_by_their_first_piece(
        db_path, monkeypatch) -> None:
    """A ``text()`` call opens its writer at its first piece, yet its attempt keeps the place
    of the call's beginning: the first call, whose first piece comes after the second's
    (both before the batch), is attempt 1, superseded by the second."""
    from fsm_engine.runtime import streams
    monkeypatch.setattr(streams, "FLUSH_S", 0.3)  # one batch, after both first pieces
    replies = [{"chunks": ["a1", "a2"], "delay_s": 0.05, "chunk_delay_s": 0.6},
               {"chunks": ["b1", "b2"], "chunk_delay_s": 0.6}]
    engine = Engine(db_path, llm=Scripted.from_replies(replies), seed=1)
    iid, done = run(engine, Machine(name="side", context=Ctx, initial="ask", states=[
        State("ask", action=side_by_side), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")]))
    assert done.context["answer"] == "a1a2|b1b2"
    log = engine.store.stream_read(iid)
    first = next(r for r in log if r.kind == "chunk")
    assert (first.attempt, first.text) == (1, "a1")  # written by the batch, in call order
    assert [(r.attempt, r.kind) for r in log if r.kind in ("open", "superseded")][:3] == [
        (1, "open"), (1, "superseded"), (2, "open")]
    engine.close()


def test_pieces_handed_over_together_are_rows_cut_at_their_own_boundaries() -> None:
    """A list (pieces of one read) is queued piece by piece, empty ones left out: rows are
    cut where the pieces end (a 16 MB burst is not one 16 MB row) and offsets run on."""
    from fsm_engine.runtime.stream_writer import ChunkWriter
    from fsm_engine.runtime.streams import Batcher, StreamTarget
    from fsm_engine.store.streams import ROW_CHARS
    big = "b" * (ROW_CHARS - 1)

    async def go() -> Any:
        w = ChunkWriter(StreamTarget(None, "i", 1, 1, batcher=Batcher(None)))
        w.add("ab")
        w.add(["", "cd", big, "ef"])
        w.add(["", ""])  # nothing at all: no row, no offset
        return w.chars, w.take()
    chars, op = asyncio.run(go())
    assert chars == 2 + 2 + len(big) + 2
    assert [(r.kind, r.text, r.offset) for r in op.rows] == [
        ("chunk", "abcd", 0), ("chunk", big, 4), ("chunk", "ef", 4 + len(big))]


class _Grouping(Scripted):
    """A provider handing over the pieces of one read together, an empty one among them
    (a role-only event's delta), then its completion."""

    async def stream(self, messages: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        yield ["Hel", "", "lo"]
        yield ["", ""]
        yield Completion("Hello", 1, 2, "stop", "g")


def test_empty_pieces_of_a_list_reach_neither_the_action_nor_the_log(db_path) -> None:
    engine = Engine(db_path, llm=_Grouping.from_replies([{"text": "Hello"}]), seed=1)
    iid, done = run(engine, machine())
    assert done.context["seen"] == ["Hel", "lo"] and done.context["answer"] == "Hello"
    assert "".join(e.text for e in collect(engine, iid) if e.kind == "chunk") == "Hello"
    engine.close()


def test_a_str_subclass_piece_is_queued_whole() -> None:
    from fsm_engine.runtime.stream_writer import ChunkWriter
    from fsm_engine.runtime.streams import Batcher, StreamTarget

    class Text(str):
        pass

    async def go() -> Any:
        w = ChunkWriter(StreamTarget(None, "i", 1, 1, batcher=Batcher(None)))
        w.add(Text("abc"))
        return w.take()
    assert [(r.kind, r.text) for r in asyncio.run(go()).rows] == [("chunk", "abc")]


async def read_twice(ctx: Ctx, step: Step) -> dict[str, Any]:
    reply = step.llm.stream([{"role": "user", "content": "x"}], max_tokens=8)
    first = await reply.text()
    try:
        await reply.text()
    except FsmError as exc:
        return {"answer": first, "seen": [str(exc)]}
    return {"answer": first, "seen": ["read twice"]}


def test_a_reply_stream_is_read_once(db_path) -> None:
    """A second ``text()`` (or ``async for``) of one ``step.llm.stream(...)`` raises: it
    made a second model call, and its pieces were written into the first's attempt."""
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": ["Hel", "lo"],
                                                         "chunk_delay_s": 0.05}]), seed=1)
    m = Machine(name="twice", context=Ctx, initial="ask", states=[
        State("ask", action=read_twice), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])
    iid, done = run(engine, m)
    assert done.context["answer"] == "Hello" and "already read" in done.context["seen"][0]
    chunks = [e.text for e in collect(engine, iid) if e.kind == "chunk"]
    assert "".join(chunks) == "Hello"
    [row] = engine.store.history(iid)
    assert len(row.detail["llm_calls"]) == 1  # one call, billed once
    engine.close()
