"""The viewer's stream of an agent instance (issue 36, "agent turns do not stream"):
``GET /instances/{id}/stream`` gives each model turn's text as chunk events (with the object
parsed so far) and each tool call as a step event holding its result."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
import agent_machine  # noqa: E402
from agent_replies import LOOP  # noqa: E402

from fsm_engine import Engine  # noqa: E402
from fsm_engine.llm import Scripted  # noqa: E402
from fsm_engine.store import open_store  # noqa: E402
from fsm_engine.ui import create_app  # noqa: E402


async def _sse(app: Any, path: str) -> list[dict[str, Any]]:
    """``GET path`` straight through the ASGI app, to the end of its body: its events."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000),
             "server": ("testserver", 80), "headers": [(b"host", b"testserver")]}
    body: list[bytes] = []
    ended = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            body.append(message.get("body", b""))
            if not message.get("more_body"):
                ended.set()
    await asyncio.wait_for(app(scope, receive, send), 60)
    return [json.loads(line[5:]) for line in b"".join(body).decode().splitlines()
            if line.startswith("data:")]


def test_the_viewer_streams_an_agents_turns_and_its_calls_results(db_path: str) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies(LOOP), seed=1)
    iid = engine.start(agent_machine.machine, {"question": "what is 2 + 3?"})
    asyncio.run(engine.run(iid))
    replies = [r.detail["llm_calls"][-1]["reply"] for r in engine.store.history(iid)
               if r.detail.get("llm_calls")]
    engine.close()
    store = open_store(db_path, readonly=True)
    try:
        events = asyncio.run(_sse(create_app(store), f"/instances/{iid}/stream"))
    finally:
        store.close()
    chunks = [e for e in events if e["kind"] == "chunk"]
    assert [e["text"] for e in chunks] == replies  # every turn, its whole reply
    assert [e["partial"] for e in chunks] == [json.loads(r) for r in replies]
    results = [(e["trigger"], e["info"].get("result")) for e in events
               if e["kind"] == "step" and e.get("info", {}).get("call")]
    assert results == [("add", "5"), ("echo", '"hi"'), ("echo", '"again"'),
                       ("send_report", '"sent"')]
    assert events[-1]["kind"] == "final"
