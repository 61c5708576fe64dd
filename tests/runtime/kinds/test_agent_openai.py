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

import agent_machine
import pytest

from fsm_engine import Engine
from fsm_engine.llm import OpenAICompatible


def _body(message: dict[str, Any]) -> bytes:
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                       "usage": {"prompt_tokens": 30, "completion_tokens": 5,
                                 "total_tokens": 35}}).encode()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(request)  # type: ignore[attr-defined]
        seen = "\n".join(str(m.get("content")) for m in request["messages"])
        if "Tool results" not in seen:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "add", "arguments": '{"a": 20, "b": 22}'}}]}
        else:
            message = {"role": "assistant", "content": '{"final": {"answer": "42"}}'}
        data = _body(message)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_openai_tool_calling_protocol_drives_the_loop(server: ThreadingHTTPServer,
                                                          tmp_path: Path) -> None:
    provider = OpenAICompatible(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                                model="m", api_key="sk-test-0123456789", timeout=5)
    engine = Engine(str(tmp_path / "fsm.db"), llm=provider)
    try:
        iid = engine.start(agent_machine.machine, {"question": "20 + 22?"})
        rec = asyncio.run(engine.run(iid))
        rows = engine.store.history(iid)
    finally:
        engine.close()
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
