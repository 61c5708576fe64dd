"""The viewer's Host check (issue 19, finding 8): a real ``fsm ui`` server on loopback
without a token serves only Host headers naming itself (loopback names or its address,
with its port) or names given with ``--allowed-host``; anything else — a rebound
``evil.example`` — gets 421 and none of the data."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fsm_engine.store import open_store
from fsm_engine.testing.contract import fleet

ENTRY = [sys.executable, "-m", "fsm_engine.cli"]


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "fsm.db")
    store = open_store(path)
    try:
        fleet(store)  # instance "d" holds "Needle here"
    finally:
        store.close()
    return path


def _serve(db: str, *extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([*ENTRY, "ui", "--db", db, "--port", "0", *extra], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert " on http://" in line, (line, proc.poll(), proc.stderr.read() if proc.poll() else "")
    return proc, int(line.split(" on http://")[1].split("/")[0].rsplit(":", 1)[1])


def _get(port: int, host: str | None, path: str = "/instances/d",
         addr: str = "127.0.0.1") -> tuple[int, bytes]:
    """A raw HTTP/1.1 GET with exactly this Host header (None: none at all)."""
    head = f"GET {path} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "")
    with socket.create_connection((addr, port), timeout=20) as sock:
        sock.sendall((head + "Connection: close\r\n\r\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data


def test_only_its_own_names_are_served(db: str) -> None:
    proc, port = _serve(db)
    try:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}",
                     f"127.0.0.2:{port}"):
            status, body = _get(port, host)
            assert status == 200 and b"Needle here" in body, host
        for host in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}",
                     f"127.0.0.1:{port + 1}", "127.0.0.1", f"10.0.0.1:{port}", "",
                     f"localhost:{port}@evil.example"):
            status, body = _get(port, host)
            assert status in (400, 421), (host, status)
            assert b"Needle" not in body and b"instances" not in body.split(b"\r\n\r\n", 1)[-1]
        status, body = _get(port, None)
        assert status in (400, 421) and b"Needle" not in body
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_allowed_host_names_are_served(db: str) -> None:
    proc, port = _serve(db, "--allowed-host", "viewer.lan", "--allowed-host", "proxy.lan:443")
    try:
        assert _get(port, "viewer.lan")[0] == 200
        assert _get(port, f"viewer.lan:{port}")[0] == 200
        assert _get(port, "proxy.lan:443")[0] == 200
        assert _get(port, "proxy.lan:8443")[0] == 421
        assert _get(port, "evil.example")[0] == 421
        assert _get(port, f"localhost:{port}")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_ipv6_loopback(db: str) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no ::1 on this machine")
    proc = subprocess.Popen([*ENTRY, "ui", "--db", db, "--port", "0", "--host", "::1"],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        port = int(line.split("]:")[1].split("/")[0])
        assert _get(port, f"[::1]:{port}", addr="::1")[0] == 200
        assert _get(port, f"[::2]:{port}", addr="::1")[0] == 421
        assert _get(port, f"evil.example:{port}", addr="::1")[0] == 421
    finally:
        proc.terminate()
        proc.wait(timeout=10)
