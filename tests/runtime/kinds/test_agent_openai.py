"""An agent state on an OpenAI-compatible server (issue 23): the tools go out in the OpenAI
tool-calling protocol (``tools``, no ``response_format``), the server's native
``tool_calls`` come back as calls the loop runs (a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import agent_machine
import pytest

from fsm_engine import Engine
from fsm_engine.llm import OpenAICompatible
from fsm_engine.llm.tool_transcript import RESULTS_PREFIX, native_messages, wire_id
from fsm_engine.runtime.kinds import agent_journal as journal
from fsm_engine.runtime.reply_cache import reply_key
from fsm_engine.store.records import HistoryRow, InstanceRecord


def _body(message: dict[str, Any]) -> bytes:
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                       "usage": {"prompt_tokens": 30, "completion_tokens": 5,
                                 "total_tokens": 35}}).encode()


def _calls(*calls: tuple[str, str]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}}
        for n, (name, args) in enumerate(calls, start=1)]}


ADD = _calls(("add", '{"a": 20, "b": 22}'))
FINAL = {"role": "assistant", "content": '{"final": {"answer": "42"}}'}


def _events(message: dict[str, Any], size: int = 4) -> bytes:
    """``message`` as a streamed reply's Server-Sent Events: its content, then each tool
    call's id and name and its arguments, in fragments of ``size`` characters (as OpenAI
    sends ``delta.tool_calls``), the finish, the usage, ``[DONE]``."""
    def event(delta: dict[str, Any], finish: str | None = None) -> str:
        return "data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk",
                                      "model": "m", "choices": [{"index": 0, "delta": delta,
                                                                 "finish_reason": finish}]})
    text = message.get("content") or ""
    out = [event({"role": "assistant", "content": text[n:n + size]})
           for n in range(0, len(text), size)]
    for n, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        out.append(event({"tool_calls": [{"index": n, "id": call["id"], "type": "function",
                                          "function": {"name": fn["name"], "arguments": ""}}]}))
        out += [event({"tool_calls": [{"index": n, "function": {
            "arguments": fn["arguments"][k:k + size]}}]})
            for k in range(0, len(fn["arguments"]), size)]
    out.append(event({}, "tool_calls" if message.get("tool_calls") else "stop"))
    out.append("data: " + json.dumps({"id": "c1", "model": "m", "choices": [], "usage": {
        "prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}}))
    return ("\n\n".join([*out, "data: [DONE]"]) + "\n\n").encode()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv: Any = self.server
        srv.requests.append(request)
        reply = srv.replies[min(len(srv.requests), len(srv.replies)) - 1]
        streamed = bool(request.get("stream"))  # (an agent turn, unless Agent(stream=False))
        data = _events(reply) if streamed else _body(reply)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.requests = []  # type: ignore[attr-defined]
    srv.replies = [ADD, FINAL]  # type: ignore[attr-defined]  # the n-th request's reply
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _provider(server: ThreadingHTTPServer) -> OpenAICompatible:
    return OpenAICompatible(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                            model="m", api_key="sk-test-0123456789", timeout=5)


def _run(server: ThreadingHTTPServer, db: Path) -> tuple[InstanceRecord, list[HistoryRow]]:
    engine = Engine(str(db), llm=_provider(server))
    try:
        iid = engine.start(agent_machine.machine, {"question": "20 + 22?"})
        rec = asyncio.run(engine.run(iid))
        return rec, engine.store.history(iid)
    finally:
        engine.close()


def test_the_openai_tool_calling_protocol_drives_the_loop(server: ThreadingHTTPServer,
                                                          tmp_path: Path) -> None:
    rec, rows = _run(server, tmp_path / "fsm.db")
    assert (rec.state, rec.context["answer"]) == ("answered", "42")
    [call] = [r for r in rows if r.detail.get("agent") == "call"]
    assert (call.detail["tool"], call.detail["result"]) == ("add", 42)
    first = server.requests[0]  # type: ignore[attr-defined]
    assert "response_format" not in first
    tools = {t["function"]["name"]: t for t in first["tools"]}
    assert tools["add"]["type"] == "function"
    assert tools["add"]["function"]["description"] == "Add two integers."
    assert tools["add"]["function"]["parameters"]["required"] == ["a", "b"]
    assert rec.tokens_used == 70


def _text_prompts(rows: list[HistoryRow]) -> list[list[dict[str, str]]]:
    """Each model turn's prompt as the journal builds it (text protocol), from the history."""
    agent = agent_machine.machine.states[0].agent
    assert agent is not None
    task = {"question": "20 + 22?", "answer": "", "verdict": ""}
    turns = [r for r in rows if "llm_calls" in r.detail]
    return [journal.messages(agent, task, journal.read(rows[:rows.index(t)], "research", 1))
            for t in turns]


def test_tool_turns_go_back_natively_and_the_journal_keeps_the_text(
        server: ThreadingHTTPServer, tmp_path: Path) -> None:
    server.replies = [_calls(("add", '{"a": 20, "b": 22}'),  # type: ignore[attr-defined]
                             ("echo", '{"text": "\u00e9t\u00e9"}')), FINAL]
    rec, rows = _run(server, tmp_path / "fsm.db")
    assert (rec.state, rec.context["answer"]) == ("answered", "42")
    first, second = server.requests  # type: ignore[attr-defined]
    sent = second["messages"]
    assert sent[:2] == first["messages"]  # system and task unchanged
    assert sent[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": wire_id("1.1"), "type": "function", "function": {"name": "add", "arguments": ANY}},
        {"id": wire_id("1.2"), "type": "function", "function": {"name": "echo", "arguments": ANY}}]}
    args = [json.loads(c["function"]["arguments"]) for c in sent[2]["tool_calls"]]
    assert args == [{"a": 20, "b": 22}, {"text": "été"}]
    assert sent[3:] == [{"role": "tool", "tool_call_id": wire_id("1.1"), "content": '{"result": 42}'},
                        {"role": "tool", "tool_call_id": wire_id("1.2"), "content": '{"result": "été"}'}]
    # the journal keeps the text protocol; the reply keys hash its text prompts
    [turn] = [r for r in rows if r.detail.get("agent") == "turn"]
    assert json.loads(turn.detail["reply"]) == {"tool_calls": [
        {"name": "add", "arguments": {"a": 20, "b": 22}},
        {"name": "echo", "arguments": {"text": "été"}}]}
    prompts = _text_prompts(rows)
    assert [native_messages(p) for p in prompts] == [first["messages"], sent]
    assert prompts[1][3]["content"].startswith(RESULTS_PREFIX)
    keys = [r.detail["llm_calls"][0]["key"] for r in rows if "llm_calls" in r.detail]
    tools = {"max_tokens": 512, "tools": first["tools"]}
    assert keys == [reply_key(_provider(server), p, tools) for p in prompts]


def test_a_fork_reusing_the_replies_asks_the_server_nothing(server: ThreadingHTTPServer,
                                                            tmp_path: Path) -> None:
    rec, _ = _run(server, tmp_path / "fsm.db")
    engine = Engine(str(tmp_path / "fsm.db"), llm=_provider(server))
    try:
        fid = engine.fork(rec.id, from_seq=0, reuse_llm=True)
        forked = asyncio.run(engine.run(fid))
    finally:
        engine.close()
    assert (forked.state, forked.context) == (rec.state, rec.context)
    assert len(server.requests) == 2  # type: ignore[attr-defined]  # both turns replayed


def test_an_errored_turn_stays_text(server: ThreadingHTTPServer, tmp_path: Path) -> None:
    server.replies = [{"role": "assistant", "content": "[1, 2"},  # type: ignore[attr-defined]
                      ADD, FINAL]
    rec, rows = _run(server, tmp_path / "fsm.db")
    assert (rec.state, rec.context["answer"]) == ("answered", "42")
    _, second, third = server.requests  # type: ignore[attr-defined]
    assert second["messages"][2] == {"role": "assistant", "content": "[1, 2"}
    fed = second["messages"][3]
    assert fed["role"] == "user" and fed["content"].startswith(RESULTS_PREFIX)
    assert "error" in json.loads(fed["content"].removeprefix(RESULTS_PREFIX))[0]
    assert third["messages"][:4] == second["messages"]  # the errored turn, still text
    assert [m["role"] for m in third["messages"][4:]] == ["assistant", "tool"]
    assert third["messages"][5]["tool_call_id"] == third["messages"][4]["tool_calls"][0]["id"]
    assert [native_messages(p) for p in _text_prompts(rows)] == [
        r["messages"] for r in server.requests]  # type: ignore[attr-defined]


def test_only_a_call_with_tools_translates(server: ThreadingHTTPServer) -> None:
    turn = [{"role": "assistant", "content": '{"tool_calls": [{"name": "add", "arguments": {}}]}'},
            {"role": "user", "content": RESULTS_PREFIX + '[{"call": "1.1", "result": 3, '
                                                         '"tool": "add"}]'}]
    provider = _provider(server)

    async def both() -> None:
        await provider.complete(turn)
        await provider.complete(turn, tools=[{"type": "function", "function": {"name": "add"}}])
        await provider.aclose()

    asyncio.run(both())
    plain, tooled = server.requests  # type: ignore[attr-defined]
    assert plain["messages"] == turn and "tools" not in plain
    assert [m["role"] for m in tooled["messages"]] == ["assistant", "tool"]
    assert tooled["messages"][1] == {"role": "tool", "tool_call_id": wire_id("1.1"),
                                     "content": '{"result": 3}'}


def _stream(db: Path, iid: str) -> list[Any]:
    engine = Engine(str(db))
    try:
        async def go() -> list[Any]:
            return [ev async for ev in engine.stream(iid)]
        return asyncio.run(go())
    finally:
        engine.close()


def test_a_turn_streams_its_tool_calls_as_their_fragments_come(
        server: ThreadingHTTPServer, tmp_path: Path) -> None:
    """Issue 36: the server's ``delta.tool_calls`` fragments are the turn's stream, shown as
    the agent protocol's text; the journal keeps ``complete()``'s text of the same calls."""
    server.replies = [_calls(("add", '{"a":20,"b":22}'),  # type: ignore[attr-defined]
                             ("echo", '{"text":"\u00e9t\u00e9"}')), FINAL]
    rec, rows = _run(server, tmp_path / "fsm.db")
    assert (rec.state, rec.context["answer"]) == ("answered", "42")
    assert all(r["stream"] is True and r["tools"] for r in server.requests)  # type: ignore[attr-defined]
    [turn] = [r for r in rows if r.detail.get("agent") == "turn"]
    events = _stream(tmp_path / "fsm.db", rec.id)
    chunks = [e for e in events if e.kind == "chunk" and e.seq == turn.seq]
    shown = "".join(e.text for e in chunks)
    assert shown == ('{"tool_calls": [{"name": "add", "arguments": {"a":20,"b":22}}, '
                     '{"name": "echo", "arguments": {"text":"été"}}]}')
    assert json.loads(shown) == json.loads(turn.detail["reply"])  # the same calls
    assert turn.detail["reply"] == json.dumps({"tool_calls": [
        {"name": "add", "arguments": {"a": 20, "b": 22}},
        {"name": "echo", "arguments": {"text": "été"}}]}, ensure_ascii=False)
    assert chunks[-1].partial == json.loads(shown)
    assert rec.tokens_used == 70  # the server's usage events, billed as complete()'s


def test_stream_false_sends_plain_requests(server: ThreadingHTTPServer, tmp_path: Path) -> None:
    import dataclasses
    state = agent_machine.machine.states[0]
    assert state.agent is not None
    quiet = dataclasses.replace(agent_machine.machine, states=[
        dataclasses.replace(state, agent=dataclasses.replace(state.agent, stream=False)),
        *agent_machine.machine.states[1:]])
    engine = Engine(str(tmp_path / "fsm.db"), llm=_provider(server))
    try:
        rec = asyncio.run(engine.run(engine.start(quiet, {"question": "20 + 22?"})))
    finally:
        engine.close()
    assert (rec.state, rec.context["answer"]) == ("answered", "42")
    assert not any("stream" in r for r in server.requests)  # type: ignore[attr-defined]
    assert not [e for e in _stream(tmp_path / "fsm.db", rec.id) if e.kind == "chunk"]


@pytest.mark.model
@pytest.mark.slow
def test_agent_turns_stream_from_a_real_llama_cpp_server(llama_server: str,
                                                         tmp_path: Path) -> None:
    """Issue 36 against ``python -m llama_cpp.server`` (Gemma): every model turn's stream is
    the reply its history row keeps, ended; whatever the small model answers, the instance
    ends final with every turn's tokens billed."""
    import dataclasses
    state = agent_machine.machine.states[0]
    assert state.agent is not None
    short = dataclasses.replace(agent_machine.machine, states=[  # two short turns at most
        dataclasses.replace(state, agent=dataclasses.replace(state.agent, max_turns=2,
                                                             max_tokens=96)),
        *agent_machine.machine.states[1:]])
    db = tmp_path / "fsm.db"
    engine = Engine(str(db), llm=OpenAICompatible(base_url=llama_server, model="gemma",
                                                  timeout=120.0))
    try:
        iid = engine.start(short, {"question": "20 + 22?"})
        rec = asyncio.run(engine.run(iid))
        rows = engine.store.history(iid)
    finally:
        engine.close()
    assert rec.final
    turns = {r.seq: r.detail["llm_calls"] for r in rows if r.detail.get("llm_calls")}
    assert turns
    events = _stream(db, iid)
    for seq, calls in turns.items():
        mine = [e for e in events if e.seq == seq and e.kind in ("open", "chunk", "end")]
        assert [e.kind for e in mine][0] == "open" and mine[-1].kind == "end"
        assert "".join(e.text for e in mine) == calls[-1]["reply"]
    assert rec.tokens_used == sum(c["tokens"] for calls in turns.values() for c in calls)


def test_an_exported_test_of_a_streamed_agent_replays_without_the_server(
        server: ThreadingHTTPServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 36: the turns streamed from the server (compact arguments, in fragments) are
    recorded as ``complete()``'s replies, which the exported test replays, asking nobody."""
    import runpy

    from cli import run_main
    server.replies = [_calls(("add", '{"a":20,"b":22}')), FINAL]  # type: ignore[attr-defined]
    rec, _ = _run(server, tmp_path / "fsm.db")
    assert rec.context["answer"] == "42"
    out_file = tmp_path / f"test_case_{rec.id}.py"
    code, _, err = run_main(["export-test", rec.id, "-o", str(out_file), "--db",
                             str(tmp_path / "fsm.db"), "--machine", agent_machine.__file__],
                            capsys)
    assert code == 0, err
    asked = len(server.requests)  # type: ignore[attr-defined]
    runpy.run_path(str(out_file))[f"test_case_{rec.id}"]()
    assert len(server.requests) == asked  # type: ignore[attr-defined]
