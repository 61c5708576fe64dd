"""A resume at the end of a 16 MiB JSON reply does not hold the viewer (issue 36 item 9):
another request sent once the resume has begun is answered before the resume's first event
(on SQLite its reads are inline on the event loop: it gives the loop a turn per batch)."""

from __future__ import annotations

import asyncio
from typing import Any

from long_reply import write_long

from fsm_engine import Engine
from fsm_engine.store import open_store
from fsm_engine.ui import create_app


class Watched:
    """A store whose ``stream_read`` sets ``began`` (the resume is reading); ``event``: set
    by the test at the stream's first event."""

    def __init__(self, store: Any) -> None:
        self.store, self.began, self.event = store, asyncio.Event(), asyncio.Event()
        self.reads = 0

    def stream_read(self, *args: Any) -> Any:
        self.reads += 1
        self.began.set()
        return self.store.stream_read(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def get(app: Any, path: str, headers: list[tuple[bytes, bytes]], name: str,
              log: list[tuple[str, int]], reads: Watched) -> None:
    """``GET path`` straight through the ASGI app; each body part (an event, for a stream)
    logged as ``(name, reads so far)``."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000),
             "server": ("testserver", 80), "headers": [(b"host", b"testserver"), *headers]}
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        body = message.get("body", b"") if message["type"] == "http.response.body" else b""
        if body.startswith(b"retry:") or not body:  # (the stream's first line: no event)
            return
        log.append((name, reads.reads))
        if name == "stream":
            reads.event.set()
    try:
        await app(scope, receive, send)
    finally:
        done.set()


def test_another_request_is_answered_while_a_long_resume_reads(db_path) -> None:
    engine = Engine(db_path, seed=1)
    iid, n = write_long(engine)
    engine.close()
    store = open_store(db_path, readonly=True)
    watched = Watched(store)
    app = create_app(watched)  # type: ignore[arg-type]
    log: list[tuple[str, int]] = []

    async def other() -> None:
        await watched.began.wait()  # the resume has begun
        await get(app, "/no/such/page", [], "other", log, watched)

    async def go() -> None:  # (the instance never ends: its stream is cut after one event)
        stream = asyncio.ensure_future(get(app, f"/instances/{iid}/stream",
                                           [(b"last-event-id", f"{n - 1}:0".encode())],
                                           "stream", log, watched))
        await asyncio.wait_for(asyncio.gather(watched.event.wait(), other()), 120)
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
    try:
        asyncio.run(go())
    finally:
        store.close()
    names = [name for name, _ in log]
    first_event = names.index("stream")
    assert "other" in names[:first_event], log[:4]
    [(_, at)] = [entry for entry in log if entry[0] == "other"]
    assert at < n // 64  # answered while the resume was reading, well before its end
