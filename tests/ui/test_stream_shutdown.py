"""``fsm ui`` stops while a stream is open (issue 36 item 13): with an SSE client reading the
stream of an unfinished instance, SIGTERM or SIGINT (Ctrl-C) ends the viewer — and the
console's engine with ``--write`` — within a bounded wait (it waited for the stream to end,
which an unfinished instance's never does)."""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import ROOT
from streamed_machine import machine

from fsm_engine import Engine

pytestmark = pytest.mark.slow
TOKEN = "shutdown-token-1"
#: Longest the test waits for the process to end (the viewer's own bound is a few seconds).
WAIT_S = 30


@pytest.mark.parametrize(("sig", "write"), [(signal.SIGTERM, False), (signal.SIGINT, False),
                                            (signal.SIGTERM, True), (signal.SIGINT, True)])
def test_fsm_ui_stops_with_a_stream_open(tmp_path: Path, sig: signal.Signals,
                                         write: bool) -> None:
    db = str(tmp_path / "fsm.db")
    engine = Engine(db, seed=1)
    iid = engine.start(machine(), {"topic": "never run"})  # (pending for good)
    engine.close()
    proc = subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", "ui", "--db", db,
                             "--port", "0", "--token", TOKEN, "--refresh", "0",
                             *(["--write"] if write else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert proc.stdout is not None
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
        assert match
        url = urlsplit(f"http://127.0.0.1:{match.group(1)}")
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=WAIT_S)
        conn.request("GET", f"/instances/{iid}/stream",
                     headers={"Authorization": f"Bearer {TOKEN}"})
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"retry:")  # the stream is open, served
        proc.send_signal(sig)
        try:
            code = proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"fsm ui still running {WAIT_S} s after {sig.name}")
        assert code in (0, 130, -sig), proc.stderr.read() if proc.stderr else ""
        assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
