"""Slow and hostile peers before authentication, against a real ``fsm ui --write``
process over real sockets (issue 36, item 10): a signed link's ``POST`` is refused on
its signature before its body is read; one deadline covers a request's header and body,
so a body that never finishes is cut; connections whose request is neither whole nor
past the gate are bounded (beyond the bound: 503 with the security headers, at once),
so a few hundred slow peers hold a few file descriptors, and the viewer serves again
once they are cut.  The in-process checks of the console's doors are in
``test_console_doors.py``."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from conftest import ROOT
from procs import stop, wait_until

from fsm_engine import Engine, load_machine
from fsm_engine.runtime.kinds import review_links
from fsm_engine.store import open_store

pytestmark = pytest.mark.slow
TOKEN = "console-token-for-tests"
ENTRY = [sys.executable, "-m", "fsm_engine.cli"]


def _review(db: str) -> str:
    machine, _ = load_machine(str(ROOT / "tests/helpers/review_machine.py"))
    engine = Engine(db, llm=None)
    try:
        iid = engine.start(machine, {"text": "hello"})
        asyncio.run(engine.run(iid))
        [item] = engine.reviews(instance_id=iid)
        return item.id
    finally:
        engine.close()


def _serve(db: str, **env: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([*ENTRY, "ui", "--write", "--db", db, "--port", "0"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "FSM_UI_TOKEN": TOKEN, **env})
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert " on http://" in line, (line, proc.poll())
    return proc, int(line.split(" on http://")[1].split("/")[0].rsplit(":", 1)[1])


def _head(port: int, method: str, target: str, extra: str = "") -> bytes:
    return (f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}").encode()


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (``socket.timeout``: it never did)."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def _link_target(db: str, item: str) -> tuple[str, str]:
    store = open_store(db)
    try:
        link = review_links.sign(store, item, "rita", 3600, time.time())
    finally:
        store.close()
    split = urllib.parse.urlsplit(review_links.url("http://x", link))
    return f"{split.path}?{split.query}", link.sig


def _served(port: int) -> bool:
    """True when a page is served whole; False while the server is still cutting the slow
    peers (a connection reset or refused meanwhile: polled again)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(_head(port, "GET", "/", f"Authorization: Bearer {TOKEN}\r\n"
                                                 "Connection: close\r\n\r\n"))
            return _answer(sock).startswith(b"HTTP/1.1 200 ")
    except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError):
        return False


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_link_post_is_refused_before_its_body_and_a_slow_body_is_cut(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    item = _review(db)
    target, sig = _link_target(db, item)
    proc, port = _serve(db, FSM_UI_HEADER_TIMEOUT="2")
    body_head = "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n"
    try:
        forged = target.replace(f"sig={sig}", "sig=" + "0" * 64)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(_head(port, "POST", forged, body_head))  # the body never comes
            got = _answer(sock)
        assert got.startswith(b"HTTP/1.1 400 ") and b"not valid" in got
        assert b"content-security-policy" in got.lower()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(_head(port, "POST", target, body_head) + b"choice=appr")
            assert b" 200 " not in _answer(sock)  # cut at the deadline, nothing decided
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")  # uvicorn's own 400 is secured too
            got = _answer(sock)
        assert got.startswith(b"HTTP/1.1 400 ") and b"content-security-policy" in got.lower()
        store = open_store(db)
        try:
            assert store.get_meta(review_links.USED + sig) is None  # the link is not spent
            assert [i.status for i in store.reviews() if i.id == item] == ["open"]
        finally:
            store.close()
    finally:
        stop(proc)


def test_slow_unauthenticated_peers_are_bounded_and_the_viewer_serves_again(
        tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    open_store(db, create=True).close()
    proc, port = _serve(db, FSM_UI_HEADER_TIMEOUT="8", FSM_UI_MAX_PENDING="8")
    held: list[socket.socket] = []
    try:
        assert _served(port)  # (its first page opens what it keeps open)
        baseline = _fds(proc.pid)
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(_head(port, "GET", "/", "X-Slow: "))  # a header that never ends
            held.append(sock)
        wait_until(lambda: _fds(proc.pid) >= baseline + 8, 20, "the server to take all 8")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as ninth:
            got = _answer(ninth)
        assert got.startswith(b"HTTP/1.1 503 ") and b"content-security-policy" in got.lower()
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            held.append(sock)
        wait_until(lambda: _fds(proc.pid) <= baseline + 8 + 2, 6,
                   "the server to hold no more than the bound")
        for sock in held:
            sock.close()
        held.clear()
        wait_until(lambda: _served(port), 30, "the viewer to serve again")
    finally:
        for sock in held:
            sock.close()
        stop(proc)
