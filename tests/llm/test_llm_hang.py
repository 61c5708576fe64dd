"""The model child under callers that give up (issue 21's hung run).

A caller whose step times out while the model child is (re)starting must not take the
start down with it: the start belongs to the supervisor, the next caller waits for the
same child instead of spawning another, and no child is left running unowned.  The child
here is a real subprocess speaking the supervisor's protocol (key on stdin, a ready line,
``/fsm/perf`` over HTTP) that takes ``START_S`` seconds to get ready, as a model load does
on a loaded machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from procs import alive

from fsm_engine.errors import ProviderUnavailable
from fsm_engine.llm.child import ModelServer

try:
    from llm_fixtures import gemma_path  # noqa: F401
except ImportError:
    from tests.helpers.llm_fixtures import gemma_path  # noqa: F401

START_S = 1.5
FAKE_CHILD = r'''
import http.server, json, os, sys, threading, time
key = sys.stdin.buffer.readline().strip().decode()
open(sys.argv[2], "a").write(f"{os.getpid()}\n")
time.sleep(float(sys.argv[3]))

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == f"Bearer {key}"
        body = b"{}" if ok else b""
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(json.dumps({"ready": True, "load_s": 0.0}), flush=True)
sys.stdin.buffer.read()  # the parent is gone: exit
'''


class SlowServer(ModelServer):
    """A supervisor whose child is the fake above (argv is the only seam)."""

    def __init__(self, script: Path, pids: Path, start_s: float) -> None:
        super().__init__("unused.gguf", alias="fake", start_timeout=30.0)
        self.script, self.pids, self.start_s = script, pids, start_s

    def _argv(self, port: int) -> list[str]:
        return [sys.executable, str(self.script), str(port), str(self.pids), str(self.start_s)]


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(FAKE_CHILD)
    srv = SlowServer(script, tmp_path / "pids", START_S)
    yield srv
    srv.close()
    for pid in _started(srv):  # never leave a child behind, whatever the outcome
        if alive(pid) and _is_ours(pid, script):
            os.kill(pid, signal.SIGKILL)


def _is_ours(pid: int, script: Path) -> bool:
    """True when ``pid`` still runs ``script`` (not a later process given the same pid)."""
    try:
        return str(script).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _started(srv: SlowServer) -> list[int]:
    return [int(p) for p in srv.pids.read_text().split()] if srv.pids.exists() else []


async def _impatient_then_patient(srv: SlowServer) -> tuple[str, float]:
    for _ in range(3):  # three steps whose timeouts fire during the start
        with pytest.raises((asyncio.TimeoutError, ProviderUnavailable)):
            await asyncio.wait_for(srv.ensure(), timeout=0.3)
    started = time.monotonic()
    url = await asyncio.wait_for(srv.ensure(), timeout=20.0)
    return url, time.monotonic() - started


def test_callers_timing_out_during_a_start_leave_one_child_and_no_orphan(server):
    url, waited = asyncio.run(_impatient_then_patient(server))
    pids = _started(server)
    assert server.pid is not None and url.endswith("/v1")
    orphans = [p for p in pids if p != server.pid and alive(p)]
    assert orphans == [], f"children started {pids}, served by {server.pid}"
    assert pids == [server.pid], f"one start, not one per caller: {pids}"
    # the patient caller waited for the start already under way, not a start of its own
    assert waited < START_S, f"waited {waited:.2f}s: the start began again"


def test_a_start_is_not_cut_by_its_first_callers_cancellation(server):
    async def go() -> str:
        task = asyncio.ensure_future(server.ensure())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await asyncio.wait_for(server.ensure(), timeout=20.0)

    asyncio.run(go())
    assert _started(server) == [server.pid]


def _request(sock, key: str) -> str:
    """One ``GET /fsm/perf`` on ``sock``, its response read whole; its status line."""
    sock.sendall(f"GET /fsm/perf HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}"
                 "\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return "(closed)"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(4096)
    return head.split(b"\r\n")[0].decode()


def test_the_child_keeps_an_idle_connection_longer_than_the_client_pool_does(gemma_path):  # noqa: F811
    """A server that drops an idle keep-alive connection no later than the client's pool
    expires it races the client's next request onto a closed socket ("Connection error.",
    no HTTP status: the supervisor then suspects the child).  The child must outlast it."""
    import select
    import socket

    from openai._constants import DEFAULT_CONNECTION_LIMITS

    expiry = DEFAULT_CONNECTION_LIMITS.keepalive_expiry or 5.0
    srv = ModelServer(gemma_path, alias="g", n_threads=1)
    try:
        asyncio.run(srv.ensure())
        child = srv._child
        assert child is not None
        with socket.create_connection(("127.0.0.1", child.port), timeout=10) as sock:
            assert " 200 " in _request(sock, child.key)
            # idle past the client pool's expiry: the server must not have hung up
            readable, _, _ = select.select([sock], [], [], expiry + 1.0)
            closed = bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
            assert not closed, f"the child closed an idle connection within {expiry + 1:g}s"
            assert " 200 " in _request(sock, child.key)
    finally:
        srv.close()
