"""Lesser limits (issue 19, finding 12): the viewer's statistics cache is bounded, a
half-sent request is dropped after the header timeout, pages cap each rendered value
(the whole value stays available as JSON), idle PostgreSQL connections are released
after a burst, a 10,000-deep JSON input is one clear error, and database files are
private (0600, their -wal and -shm too)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fsm_engine.errors import InvalidInput
from fsm_engine.process import session_name
from fsm_engine.store import open_store
from fsm_engine.testing.contract import fleet, record
from fsm_engine.testing.postgres import PostgresCluster

ENTRY = [sys.executable, "-m", "fsm_engine.cli"]
DEPTH = 10_000


def _deep(depth: int = DEPTH) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


def _machine(tmp_path: Path) -> Path:
    from plain_source import PLAIN
    module = tmp_path / "plain.py"
    module.write_text(PLAIN.replace('note: str = ""', 'note: object = None'))
    return module


def test_deep_json_input_file_is_one_error_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"note": ' + "[" * DEPTH + "]" * DEPTH + "}")
    db = tmp_path / "fsm.db"
    got = subprocess.run([*ENTRY, "run", str(_machine(tmp_path)), "--input", str(deep),
                          "--db", str(db), "--llm", "scripted:" + str(deep)],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 2, got.stderr[-2000:]
    assert got.stderr.startswith("fsm: error: ") and got.stderr.count("\n") == 1, got.stderr
    assert "Traceback" not in got.stderr and "nests" in got.stderr


def test_deep_input_to_engine_start_is_refused_whole(store_url: str, tmp_path: Path) -> None:
    from fsm_engine import Engine
    from fsm_engine.runtime import load_machine
    machine, _ = load_machine(str(_machine(tmp_path)))
    engine = Engine(store_url, llm=None)
    try:
        with pytest.raises(InvalidInput, match="nests"):
            engine.start(machine, {"note": _deep()})
        assert engine.store.list() == []  # nothing half-written
        engine.start(machine, {"note": _deep(40)})  # 80 levels still fit
    finally:
        engine.close()


def test_database_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "fsm.db"
        store = open_store(str(path))
        try:
            fleet(store)
            for suffix in ("", "-wal", "-shm"):
                found = Path(str(path) + suffix)
                assert found.exists(), suffix
                mode = stat.S_IMODE(found.stat().st_mode)
                assert mode == 0o600, (suffix, oct(mode))
        finally:
            store.close()
    finally:
        os.umask(old)


def _connections(cluster: PostgresCluster) -> int:
    rows = cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                       f"'{session_name()}'")
    return int(rows[0][0])


def test_idle_postgres_connections_are_released(pg_cluster: PostgresCluster) -> None:
    from fsm_engine.store.postgres import MAX_IDLE, PostgresStore
    store = PostgresStore(pg_cluster.database())
    try:
        gate = threading.Barrier(24)

        def burst() -> None:
            gate.wait()
            store._run(lambda conn: conn.execute("SELECT pg_sleep(0.3)"))
        threads = [threading.Thread(target=burst) for _ in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert _connections(pg_cluster) <= MAX_IDLE  # not the burst's 24
        assert store.count(__import__("fsm_engine.store", fromlist=["InstanceFilter"])
                           .InstanceFilter()) == {}  # still works
    finally:
        store.close()


def test_viewer_statistics_cache_is_bounded(tmp_path: Path) -> None:
    from fsm_engine.ui.data import STATS_CACHE_MAX, Viewer
    store = open_store(str(tmp_path / "fsm.db"))
    try:
        fleet(store)
        viewer = Viewer(store)
        for i in range(3 * STATS_CACHE_MAX):
            with pytest.raises(InvalidInput):
                viewer.machine(f"no-such-machine-{i}")
        assert viewer.machine("m1")["stats"].instances == 4
        assert len(viewer._stats) <= STATS_CACHE_MAX
    finally:
        store.close()


def _serve(db: str, **env: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([*ENTRY, "ui", "--db", db, "--port", "0"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env})
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert " on http://" in line, (line, proc.poll())
    return proc, int(line.split(" on http://")[1].split("/")[0].rsplit(":", 1)[1])


def test_half_sent_request_is_dropped_after_the_header_timeout(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    store = open_store(db)
    fleet(store)
    store.close()
    proc, port = _serve(db, FSM_UI_HEADER_TIMEOUT="1")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=15) as half:
            half.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=15) as other:
                other.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                              "Connection: close\r\n\r\n".encode())
                assert b" 200 " in other.recv(100)  # others are served meanwhile
            got = b""
            while chunk := half.recv(4096):  # the server closes it: recv returns b""
                got += chunk
            waited = time.monotonic() - started
        assert waited < 10, waited
        assert b"Needle" not in got
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_pages_cap_each_value(store_url: str) -> None:
    from starlette.testclient import TestClient

    from fsm_engine.ui import create_app
    big = "x" * 5_000_000
    store = open_store(store_url)
    rec = record("big")
    rec.context = {"big": big, "small": "fine"}
    store.create(rec)
    store.close()
    readonly = open_store(store_url, readonly=True)
    try:
        client = TestClient(create_app(readonly))
        page = client.get("/instances/big")
        assert page.status_code == 200
        assert len(page.content) < 300_000, len(page.content)
        assert "5,000,0" in page.text and "/instances/big/json" in page.text
        whole = client.get("/instances/big/json")
        assert whole.status_code == 200
        assert whole.headers["content-type"].startswith("application/json")
        assert json.loads(whole.content)["context"]["big"] == big
    finally:
        readonly.close()
