"""``fsm serve`` as a real process on a loopback port, driven by httpx, beside a real
``fsm worker`` (issue 38 item 7): start, an idempotent start (the same id; another input
409), get, the stream read until ``final`` while a send moves the instance on, each error
code over the wire, SIGTERM with a stream open, and the command's own refusals (one line,
exit 2, the token never printed)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
from conftest import ROOT  # noqa: E402
from procs import stop, wait_until  # noqa: E402

from fsm_engine.store import open_store  # noqa: E402

pytestmark = pytest.mark.slow
MODULE = "tests/helpers/api_machine.py"
FSM = [sys.executable, "-m", "fsm_engine.cli"]
TOKEN = "proc-token-abcdefghijklmnop"
#: Seconds a connection of the door has to send a request whole (``FSM_UI_HEADER_TIMEOUT``).
SEND_S = 2


@dataclass
class Door:
    url: str
    db: str
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[str]

    def client(self, token: str | None = TOKEN) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FSM_MACHINES_ROOT": str(ROOT),
            "FSM_DB": str(tmp_path / "fsm.db"), "FSM_UI_HEADER_TIMEOUT": str(SEND_S)}


@pytest.fixture
def door(tmp_path: Path) -> Iterator[Door]:
    env = _env(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    log = tmp_path / "serve.err"
    serve = subprocess.Popen([*FSM, "serve", "--machines", MODULE, "--token-file",
                              str(token_file), "--port", "0"], env=env, cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=log.open("w"))
    worker_log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen([*FSM, "worker", "--poll", "0.05"], env=env, cwd=ROOT,
                              stdout=worker_log, stderr=worker_log)
    try:
        line = serve.stdout.readline() if serve.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/api/", line)
        assert match, (line, log.read_text())
        assert TOKEN not in line
        yield Door(f"http://127.0.0.1:{match.group(1)}", env["FSM_DB"], env, log, serve)
    finally:
        stop(worker)
        stop(serve)
        worker_log.close()
    assert "Traceback" not in log.read_text()


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def test_start_get_stream_and_send_through_the_door(door: Door) -> None:
    with door.client() as client:
        key = {"Idempotency-Key": "order-o-1"}
        started = client.post("/api/machines/door/instances",
                              json={"input": {"order": "o-1", "qty": 2}}, headers=key)
        assert started.status_code == 201, started.text
        iid = started.json()["id"]
        assert started.json() == {"id": iid, "machine": "door", "created": True}
        again = client.post("/api/machines/door/instances",
                            json={"input": {"order": "o-1", "qty": 2}}, headers=key)
        assert (again.status_code, again.json()["id"], again.json()["created"]) == (
            200, iid, False)
        conflict = client.post("/api/machines/door/instances",
                               json={"input": {"order": "o-1", "qty": 3}}, headers=key)
        assert (conflict.status_code, conflict.json()["error"]["code"]) == (409, "key_conflict")
        wait_until(lambda: client.get(f"/api/instances/{iid}").json()["status"] == "waiting",
                   60, "a worker to take it to its wait")
        got = client.get(f"/api/instances/{iid}").json()
        assert (got["state"], got["context"]["order"], got["context"]["qty"]) == ("hold", "o-1", 2)
        kinds = []
        with client.stream("GET", f"/api/instances/{iid}/stream") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = _events(stream)
            sent = client.post(f"/api/instances/{iid}/send",
                               json={"trigger": "release", "payload": {"note": "go"}})
            assert sent.status_code == 200, sent.text
            for event in events:
                kinds.append(event["kind"])
                if event["kind"] == "final":
                    break
        assert kinds[-1] == "final" and "step" in kinds
        done = client.get(f"/api/instances/{iid}").json()
        assert (done["status"], done["state"], done["context"]["note"]) == (
            "completed", "done", "go shipped")
    store = open_store(door.db)
    try:
        rows = store.history(iid)
        sent_row = next(r for r in rows if r.trigger == "release")
        assert sent_row.detail["operator"] == "api"
        assert [r.id for r in store.list()] == [iid]  # the repeat and the conflict: nothing
    finally:
        store.close()


def test_a_delayed_start_is_scheduled_then_a_worker_takes_it_once_due(door: Door) -> None:
    with door.client() as client:
        started = client.post("/api/machines/door/instances",
                              json={"input": {"order": "later"}, "delay": 2, "priority": 3})
        assert started.status_code == 201, started.text
        iid = started.json()["id"]
        got = client.get(f"/api/instances/{iid}").json()
        assert got["priority"] == 3
        assert got["due_at"] - got["created_at"] == pytest.approx(2, abs=0.5)
        # scheduled until due (a loaded machine may read it after its time: then taken)
        assert got["status"] == "scheduled" or time.time() >= got["due_at"]
        wait_until(lambda: client.get(f"/api/instances/{iid}").json()["status"] == "waiting",
                   60, "a worker to take the delayed start once due")


def test_each_refusal_over_the_wire_has_its_code_and_writes_nothing(door: Door) -> None:
    path = "/api/machines/door/instances"
    with door.client() as client, door.client(None) as anonymous, \
            door.client(TOKEN[:-1] + "!") as wrong:
        cases = [
            (anonymous.post(path, json={"input": {"order": "a"}}), 401, "unauthorized"),
            (wrong.post(path, json={"input": {"order": "a"}}), 401, "unauthorized"),
            (client.post(path, content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
                         headers={"content-type": "application/json"}), 413, "body_too_large"),
            (client.post(path, content=b"not json"), 400, "invalid_json"),
            (client.post(path, json=[1, 2]), 400, "not_an_object"),
            (client.post(path, json={"input": {"qty": 1}}), 422, "invalid_input"),
            (client.post("/api/machines/other/instances", json={"input": {"order": "a"}}),
             404, "not_found"),
            (client.get("/api/instances/nosuch"), 404, "not_found"),
        ]
        for response, status, code in cases:
            assert response.status_code == status, (code, response.text)
            assert response.json() == {"error": {"code": code,
                                                 "message": response.json()["error"]["message"]}}
            assert TOKEN not in response.text
        assert client.get("/api/openapi.json").json()["openapi"].startswith("3.1")
    store = open_store(door.db)
    try:
        assert store.list() == []
    finally:
        store.close()


def test_a_body_that_stalls_over_the_wire_is_cut_and_writes_nothing(door: Door) -> None:
    port = int(door.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(b"POST /api/machines/door/instances HTTP/1.1\r\nHost: 127.0.0.1:"
                     + str(port).encode() + b"\r\nAuthorization: Bearer " + TOKEN.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     + b'{"input": {"order": ')  # and the rest never comes
        answer = b""
        while chunk := conn.recv(4096):  # until the server closes it (or answers and closes)
            answer += chunk
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
    with door.client() as client:  # the door still serves, and nothing was started
        assert client.get("/api/openapi.json").status_code == 200
    store = open_store(door.db)
    try:
        assert store.list() == []
    finally:
        store.close()


def test_sigterm_with_a_stream_open_stops_the_door(door: Door) -> None:
    with door.client() as client:
        iid = client.post("/api/machines/door/instances",
                          json={"input": {"order": "o-2"}}).json()["id"]
        with client.stream("GET", f"/api/instances/{iid}/stream") as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("retry:")  # open, served
            door.proc.send_signal(signal.SIGTERM)
            try:
                code = door.proc.wait(30)
            except subprocess.TimeoutExpired:
                pytest.fail("fsm serve still running 30 s after SIGTERM")
    assert code in (0, -signal.SIGTERM)


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FSM, "serve", "--machines", MODULE, *args], env=_env(tmp_path),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("content", "args", "says"), [
    (None, (), "cannot read --token-file"),
    ("short", (), "at least 16 characters"),
    ("two words-long-enough", (), "one word"),
    (TOKEN, ("--host", "0.0.0.0"), "give --expose too"),
    (TOKEN, ("--machines", "tests/helpers/no_such_machine.py"), "cannot load machine"),
])
def test_the_command_refuses_in_one_line_without_showing_the_token(
        tmp_path: Path, content: str | None, args: tuple[str, ...], says: str) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    done = _serve(tmp_path, "--token-file", str(token_file), "--port", "0", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("fsm: error: ") and len(done.stderr.splitlines()) == 1
    assert says in done.stderr
    assert content is None or content not in done.stderr
    assert not (tmp_path / "fsm.db").exists()  # refused before the store is opened
