"""An OpenAI-compatible server's Server-Sent Events (issue 22): ``OpenAICompatible.stream``
yields the pieces as they arrive, reads the usage of the last event, and the bounds of
``llm.http`` (size cap, deadline) hold for the whole stream.  Peers are raw sockets on
loopback (``http_peers``)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest
from http_peers import Peer

from fsm_engine.errors import ProviderTimeout, ResponseTooLarge, ServerError
from fsm_engine.llm.base import Completion
from fsm_engine.llm.openai_compat import OpenAICompatible

MSG = [{"role": "user", "content": "hi"}]
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Connection: close\r\n\r\n")


def event(delta: dict[str, Any] | None, finish: str | None = None,
          usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 0,
                            "model": "served", "choices": []}
    if delta is not None:
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def stream_of(words: list[str], usage: bool = True, gap: float = 0.0) -> Any:
    def behaviour(conn: socket.socket, request: bytes, peer: Peer) -> None:
        peer.send(conn, HEAD + event({"role": "assistant", "content": ""}))
        for word in words:
            time.sleep(gap)
            peer.send(conn, event({"content": word}))
        peer.send(conn, event({}, "stop"))
        if usage:
            peer.send(conn, event(None, usage={"prompt_tokens": 9, "completion_tokens": 4,
                                               "total_tokens": 13}))
        peer.send(conn, b"data: [DONE]\n\n")
    return behaviour


def pieces(peer: Peer, **kwargs: Any) -> list[Any]:
    """The pieces ``stream`` yields, a list of those that came in one read taken apart
    (each such list holds two or more ``str``), then its ``Completion``."""
    async def go() -> list[Any]:
        llm = OpenAICompatible(base_url=f"{peer.url}/v1", model="m", api_key="sk-test-streams",
                               timeout=5)
        try:
            out: list[Any] = []
            async for p in llm.stream(MSG, **kwargs):
                if isinstance(p, list):
                    assert len(p) > 1 and all(isinstance(s, str) for s in p)
                    out += p
                else:
                    out.append(p)
            return out
        finally:
            await llm.aclose()
    return asyncio.run(go())


def test_sse_pieces_then_the_completion_with_the_servers_usage() -> None:
    peer = Peer(stream_of(["Hel", "lo ", "wor", "ld"]))
    try:
        *got, done = pieces(peer, max_tokens=9)
    finally:
        peer.close()
    assert got == ["Hel", "lo ", "wor", "ld"] and isinstance(done, Completion)
    assert (done.text, done.prompt_tokens, done.completion_tokens, done.finish_reason,
            done.model, done.usage_missing) == ("Hello world", 9, 4, "stop", "served", False)
    body = json.loads(peer.requests[0].partition(b"\r\n\r\n")[2])
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 9


def test_a_stream_without_usage_is_counted_and_flagged() -> None:
    peer = Peer(stream_of(["a", "b", "c", "d", "e", "f"], usage=False))
    try:
        *_, done = pieces(peer)
    finally:
        peer.close()
    assert done.usage_missing and done.completion_tokens == 6 and done.prompt_tokens > 0


def test_the_size_cap_holds_for_the_whole_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_HTTP_MAX_BYTES", str(64 * 1024))
    peer = Peer(stream_of(["x" * 1000] * 500))  # ~0.5 MB of events
    try:
        with pytest.raises(ResponseTooLarge):
            pieces(peer)
    finally:
        peer.close()
    assert peer.sent < 4 * 1024 * 1024


def test_the_deadline_holds_for_the_whole_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_HTTP_DEADLINE", "0.5")
    peer = Peer(stream_of(["tick "] * 100, gap=0.05))  # 5 s of a live, trickling stream
    try:
        with pytest.raises(ProviderTimeout):
            pieces(peer)
    finally:
        peer.close()
    assert peer.sent < 60 * 400  # cut after about half a second of events


def test_an_event_line_that_never_ends_is_refused() -> None:
    def behaviour(conn: socket.socket, request: bytes, peer: Peer) -> None:
        peer.send(conn, HEAD + b"data: {\"choices\": [{\"delta\": {\"content\": \"")
        while peer.sent < 4 * 1024 * 1024:
            peer.send(conn, b"x" * 65536)
    peer = Peer(behaviour)
    try:
        with pytest.raises(ServerError, match="an event over"):
            pieces(peer)
    finally:
        peer.close()


def test_an_error_event_mid_stream_is_a_server_error() -> None:
    def behaviour(conn: socket.socket, request: bytes, peer: Peer) -> None:
        peer.send(conn, HEAD + event({"content": "half"}))
        peer.send(conn, b'data: {"error": {"message": "overloaded"}}\n\n')
    peer = Peer(behaviour)
    try:
        with pytest.raises(ServerError, match="failed mid-stream: .*overloaded"):
            pieces(peer)
    finally:
        peer.close()


def test_a_peer_that_dies_mid_stream_is_a_retryable_server_error() -> None:
    """A server killed while it streams (found by ``test_real_server``: llama_cpp.server
    stopped mid-run) cuts a chunked body short; httpx raises ``RemoteProtocolError``, which
    must reach the engine as a retryable ``ServerError`` (retry, breaker, fallback), not as
    an unexpected error that fails the instance."""
    def behaviour(conn: socket.socket, request: bytes, peer: Peer) -> None:
        head = HEAD.replace(b"Connection: close\r\n", b"Transfer-Encoding: chunked\r\n")
        data = event({"role": "assistant", "content": "Hel"})
        peer.send(conn, head + b"%x\r\n" % len(data) + data + b"\r\n")
        conn.shutdown(socket.SHUT_RDWR)  # gone before the terminating chunk
    peer = Peer(behaviour)
    try:
        with pytest.raises(ServerError, match="closed|incomplete|connection"):
            pieces(peer)
    finally:
        peer.close()


KEEP = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked"
        b"\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def kept_alive(words: list[str], calls: int, stall: threading.Event | None = None,
               gave_up: threading.Event | None = None) -> Any:
    """Serves ``calls`` streamed replies on one kept-alive connection (chunked bodies); with
    ``stall``, the body after ``[DONE]`` never ends until it is set (``gave_up`` when 20 s
    passed first)."""
    from http_peers import _read_request

    def behaviour(conn: socket.socket, request: bytes, peer: Peer) -> None:
        for n in range(calls):
            if n:
                peer.requests.append(_read_request(conn))
            peer.send(conn, KEEP)
            for word in words:
                peer.send(conn, chunk(event({"content": word})))
            peer.send(conn, chunk(event({}, "stop")) + chunk(b"data: [DONE]\n\n"))
            if stall is not None:
                if not stall.wait(20) and gave_up is not None:
                    gave_up.set()
                return
            peer.send(conn, b"0\r\n\r\n")
    return behaviour


def test_streamed_calls_reuse_one_kept_alive_connection() -> None:
    """After ``[DONE]`` the body's end is read, so the connection goes back to the pool: two
    streamed calls, one TCP connection (each used to open its own: a TLS handshake each)."""
    peer = Peer(kept_alive(["ab", "cd"], calls=2))

    async def go() -> list[str]:
        llm = OpenAICompatible(base_url=f"{peer.url}/v1", model="m", api_key="sk-keep",
                               timeout=5)
        try:
            return [[p async for p in llm.stream(MSG)][-1].text for _ in range(2)]
        finally:
            await llm.aclose()
    try:
        texts = asyncio.run(go())
    finally:
        peer.close()
    assert texts == ["abcd", "abcd"] and peer.connections == 1 and len(peer.requests) == 2


def test_a_body_that_never_ends_after_done_costs_only_its_connection() -> None:
    """A server that sends ``[DONE]`` and then holds the body open: the reply is whole, the
    call returns with it (not at the deadline), and the connection is dropped."""
    stall, gave_up = threading.Event(), threading.Event()
    peer = Peer(kept_alive(["whole"], calls=1, stall=stall, gave_up=gave_up))

    async def go() -> Any:
        llm = OpenAICompatible(base_url=f"{peer.url}/v1", model="m", api_key="sk-stall",
                               timeout=30)
        try:
            return [p async for p in llm.stream(MSG)][-1]
        finally:
            await llm.aclose()
    try:
        done = asyncio.run(go())
        held = not gave_up.is_set()  # (the server still holding when the call returned)
    finally:
        stall.set()
        peer.close()
    assert done.text == "whole" and done.finish_reason == "stop" and held


DEEP = "[" * 5000 + "]" * 5000


def test_an_event_nested_5000_deep_is_a_server_error_not_a_recursion_error() -> None:
    """(issue 36) A streamed event nesting 5,000 deep is refused as bad JSON, in one line."""
    def behaviour(conn: socket.socket, request: bytes, peer: Peer) -> None:
        peer.send(conn, HEAD + event({"content": "half"}))
        peer.send(conn, b'data: {"choices": [], "x": ' + DEEP.encode() + b"}\n\n")
        peer.send(conn, b"data: [DONE]\n\n")
    peer = Peer(behaviour)
    try:
        with pytest.raises(ServerError, match="not JSON"):
            pieces(peer)
    finally:
        peer.close()


def test_a_streamed_reply_of_deep_json_text_is_its_text() -> None:
    """(issue 36) Deep JSON as the reply's *text* is the caller's to judge: it arrives."""
    peer = Peer(stream_of([DEEP[:2500], DEEP[2500:]]))
    try:
        out = pieces(peer)
    finally:
        peer.close()
    assert out[-1].text == DEEP


def _answer(body: bytes) -> Any:
    def behaviour(conn: socket.socket, request: bytes, peer: Peer) -> None:
        peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return behaviour


def _complete(peer: Peer) -> Completion:
    async def go() -> Completion:
        llm = OpenAICompatible(base_url=f"{peer.url}/v1", model="m", api_key="sk-test-deep",
                               timeout=5)
        try:
            return await llm.complete(MSG)
        finally:
            await llm.aclose()
    return asyncio.run(go())


def _body(message_extra: str) -> bytes:
    return ('{"id": "c1", "object": "chat.completion", "created": 0, "model": "m", '
            '"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": '
            '"assistant", "content": "ok"' + message_extra + '}}], "usage": '
            '{"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}').encode()


def test_a_completion_body_nested_5000_deep_is_a_server_error() -> None:
    """(issue 36) The SDK reads the body with ``json``: 5,000 deep is a ServerError."""
    peer = Peer(_answer(_body(', "x": ' + DEEP)))
    try:
        with pytest.raises(ServerError, match="nests too deep|not JSON"):
            _complete(peer)
    finally:
        peer.close()


def test_native_tool_call_arguments_nested_5000_deep_stay_text() -> None:
    """(issue 36) A tool call's ``arguments`` string nesting 5,000 deep is kept as text
    (the agent then refuses it as arguments that are not an object), never parsed."""
    call = {"id": "a", "type": "function",
            "function": {"name": "add", "arguments": DEEP}}
    peer = Peer(_answer(_body(', "tool_calls": ' + json.dumps([call]))))
    try:
        out = _complete(peer)
    finally:
        peer.close()
    assert json.loads(out.text) == {"tool_calls": [{"name": "add", "arguments": DEEP}]}


def test_a_model_list_nested_5000_deep_is_one_provider_error() -> None:
    """(issue 36) ``GET /models`` answered 5,000 deep: the header's sync look-up and the
    run's async one each end in one ProviderError, never a RecursionError."""
    from fsm_engine.errors import ProviderError
    peer = Peer(_answer(('{"object": "list", "data": ' + DEEP + "}").encode()))
    try:
        llm = OpenAICompatible(base_url=f"{peer.url}/v1", api_key="sk-test-deep", timeout=5)
        with pytest.raises(ProviderError, match="cannot list the models"):
            llm.resolve_model_sync()
        with pytest.raises(ProviderError, match="nests too deep"):
            asyncio.run(llm.resolve_model())
    finally:
        peer.close()
