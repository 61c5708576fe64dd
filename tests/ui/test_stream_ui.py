"""The viewer's stream (issue 22): ``GET /instances/{id}/stream`` as Server-Sent Events
from a real ``fsm ui`` process while a worker process streams, read by a plain HTTP client
(before the step commits; a reconnect with ``Last-Event-ID`` resumes with no gap and no
repeat) and by Chromium (the instance page's live text)."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import pytest
from procs import wait_until
from stream_harness import WORDS, contiguous, procs_fixture  # noqa: F401 - the fixture

from fsm_engine.store import open_store

pytestmark = pytest.mark.slow
TOKEN = "stream-test-token-1"
SLOW = [{"chunks": WORDS, "chunk_delay_s": 0.02, "completion_tokens": 24}]


class Events:
    """One SSE connection: ``(id, event)`` pairs as they arrive."""

    def __init__(self, base: str, path: str, last_id: str | None = None) -> None:
        url = urlsplit(base)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        self.conn.request("GET", path, headers=headers)
        self.response = self.conn.getresponse()

    def next(self) -> tuple[str, dict[str, Any]] | None:
        """The next event with data (None: the response ended)."""
        fields: dict[str, str] = {}
        while True:
            line = self.response.readline()
            if not line:
                return None
            text = line.decode("utf-8").rstrip("\n")
            if text:
                name, _, value = text.partition(":")
                fields[name] = value.removeprefix(" ")
            elif "data" in fields:
                return fields.get("id", ""), json.loads(fields["data"])
            else:
                fields = {}

    def until(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        out = []
        while (ev := self.next()) is not None:
            out.append(ev)
            if ev[1]["kind"] == kind:
                return out
        raise AssertionError(f"the stream ended before a {kind!r} event: {out[-3:]}")

    def close(self) -> None:
        self.conn.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sse_reaches_a_plain_client_before_the_commit_and_resumes_exactly(
        procs: Any, backend: str, request: pytest.FixtureRequest) -> None:
    db = request.getfixturevalue("pg_cluster").database() if backend == "postgres" else None
    p = procs(SLOW, db)
    gate, start = p.tmp / "gate", p.tmp / "start"
    p.worker(GATE=str(gate), START_GATE=str(start))  # writes once the page is open
    base = p.viewer(TOKEN)
    first = Events(base, "/instances/s1/stream")
    assert first.response.status == 200
    assert first.response.getheader("content-type", "").startswith("text/event-stream")
    start.touch()  # the model writes from now on, a client reading
    head = [first.next() for _ in range(4)]  # then the client goes away mid-stream
    first.close()
    assert all(h is not None for h in head)
    last_id = head[-1][0]  # type: ignore[index]
    again = Events(base, "/instances/s1/stream", last_id)
    rest = again.until("end")
    store = open_store(p.db)
    try:
        assert store.get("s1").seq == 0  # the whole reply arrived; the step has not committed
        gate.touch()
        rest += again.until("final")
        reply = store.history("s1")[0].detail["llm_calls"][0]["reply"]
    finally:
        store.close()
        again.close()
    seen = [e for e in head if e is not None] + rest
    whole = Events(base, "/instances/s1/stream")  # afterwards, from the start
    everything = whole.until("final")
    whole.close()
    assert seen == everything  # no gap, no repeat across the reconnect
    log = [ev for _, ev in seen if ev["kind"] not in ("step", "final")]
    assert [ev["offset"] for ev in log] == list(range(len(log)))
    assert contiguous([ev for _, ev in seen if ev["kind"] == "chunk"]) == "".join(WORDS) == reply
    assert [ev["kind"] for _, ev in seen][-2:] == ["step", "final"]


def test_sse_refuses_an_unknown_instance_and_a_bad_offset(procs: Any) -> None:
    p = procs(SLOW)
    p.worker().wait(60)
    base = p.viewer(TOKEN)
    missing = Events(base, "/instances/nope/stream")
    assert missing.response.status == 404 and "nope" in missing.response.read().decode()
    for offset in ("1;DROP", "99999999999999999999999"):  # (the second cut the response short)
        bad = Events(base, "/instances/s1/stream", offset)
        assert bad.response.status == 400 and b"bad stream offset" in bad.response.read()
    done = Events(base, "/instances/s1/stream")  # a final instance: its log, then final
    kinds = [ev["kind"] for _, ev in done.until("final")]
    assert kinds[0] == "open" and kinds[-3:] == ["end", "step", "final"]
    assert done.next() is None  # and the response ends


def test_chromium_shows_the_live_text_before_the_commit(procs: Any) -> None:
    from browser import CHROMIUM, DRIVER, _need_browser, load
    _need_browser()
    import shutil
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    words = [f"word{i:02d} " for i in range(60)]  # six seconds of writing
    p = procs([{"chunks": words, "chunk_delay_s": 0.1, "completion_tokens": 60}])
    gate, start = p.tmp / "gate", p.tmp / "start"
    p.worker(GATE=str(gate), START_GATE=str(start))  # writes once the page is open
    base = p.viewer(TOKEN)
    profile = tempfile.mkdtemp(prefix="fsm-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        load(driver, f"{base}/?token={TOKEN}")
        load(driver, f"{base}/instances/s1")
        start.touch()  # the model writes for six seconds from now, the page open on it

        def live_text() -> str:
            return str(driver.execute_script(
                "var t = document.getElementById('live-text'); return t ? t.textContent : ''"))
        chars = []
        wait_until(lambda: chars.append(len(live_text())) or live_text() == "".join(words), 60,
                   "the whole reply on the page", interval=0.02)
        assert len(set(chars)) > 2  # it grew while the model wrote, not at once
        store = open_store(p.db)
        try:
            assert store.get("s1").seq == 0  # before the step commits
        finally:
            store.close()
        assert driver.execute_script("return document.scripts.length") == 1
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"
                  and "favicon.ico" not in e.get("message", "")]
        assert not errors, errors  # no CSP refusal, no script error
        gate.touch()  # the step commits, the instance ends: the page reloads as final
        wait_until(lambda: driver.execute_script(
            "return document.getElementById('live') === null && "
            "document.readyState === 'complete'"), 60, "the final page", interval=0.05)
        assert driver.execute_script("return document.scripts.length") == 0
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _cpu_ticks(pid: int) -> int:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_a_client_that_never_reads_blocks_nothing_and_costs_bounded_memory(procs: Any) -> None:
    import socket
    piece = "x" * 999 + "\n"
    n = 16_000  # 16 MB of reply
    p = procs([{"chunks": [piece] * n, "completion_tokens": n}])
    gate = p.tmp / "gate"
    worker = p.worker(GATE=str(gate))  # streams it all, then holds its commit at the gate
    base = p.viewer(TOKEN)
    server = p.started[-1]
    url = urlsplit(base)
    before = _rss_kib(server.pid)
    sock = socket.create_connection((url.hostname, url.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.sendall(f"GET /instances/s1/stream HTTP/1.1\r\nHost: {url.netloc}\r\n"
                 f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    gate.touch()
    assert worker.wait(120) == 0  # the engine finished while the client read nothing
    store = open_store(p.db)
    try:
        assert store.get("s1").status == "completed"
    finally:
        store.close()
    ticks: list[int] = []  # the server goes idle: blocked on a client that does not read
    wait_until(lambda: ticks.append(_cpu_ticks(server.pid)) or (
        len(ticks) > 10 and ticks[-1] == ticks[-11]), 60, "the server to go idle", interval=0.05)
    grown = _rss_kib(server.pid) - before
    print(f"\nclient never reading, {n * 1000 / 1e6:.0f} MB streamed: the viewer's RSS grew "
          f"{grown / 1024:.1f} MiB")
    assert grown < 12 * 1024  # a batch of rows and the socket's buffer, not the 16 MB reply
    sock.settimeout(30)
    data = bytearray()
    while b'"kind": "final"' not in data[-400:]:  # now read it all: nothing was lost
        got = sock.recv(1 << 20)
        assert got, "the stream ended early"
        data += got
    sock.close()
    text = "".join(json.loads(line[6:])["text"] for line in bytes(data).decode().splitlines()
                   if line.startswith("data: ") and '"kind": "chunk"' in line)
    assert text == piece * n
