"""Fork options: --reuse-llm replays the original's replies where prompts match, --redeliver
delivers the original's side effects again (to a real loopback webhook)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fsm_engine.llm import Scripted

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
sys.path.insert(0, str(HELPERS))
import fork_llm_machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
REPLIES = [{"match": "Q1", "text": "one", "prompt_tokens": 5, "completion_tokens": 3},
           {"match": "Q2", "text": "two", "prompt_tokens": 7, "completion_tokens": 4}]


class Sink:
    """A loopback webhook keeping each delivery's idempotency key and body."""

    def __init__(self) -> None:
        got: list[tuple[str, dict]] = []
        self.got = got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                got.append((self.headers["Idempotency-Key"], body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sink]:
    s = Sink()
    monkeypatch.setenv("FORK_SINK_URL", s.url)
    yield s
    s.close()


def _original(engine) -> str:  # noqa: ANN001
    iid = engine.start(fork_llm_machine.machine, {"text": "hi"})
    assert asyncio.run(engine.run(iid)).status == "completed"
    return iid


def test_reuse_llm_spends_nothing_where_prompts_match_and_calls_where_they_differ(
        engine_factory, sink: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = Scripted.from_replies(REPLIES, model="m")
    engine = engine_factory(llm=llm)
    iid = _original(engine)
    assert (llm.calls, engine.store.get(iid).tokens_used) == (2, 19)
    monkeypatch.setenv("ASK2_SUFFIX", " (edited prompt)")
    reused = engine.fork(iid, from_seq=0, reuse_llm=True)
    fresh = engine.fork(iid, from_seq=0)  # --fresh, the default
    assert engine.store.get(reused).fork_options == {"reuse_llm": True}
    done = asyncio.run(engine.run(reused))
    assert done.status == "completed" and (done.context["a1"], done.context["a2"]) == ("one", "two")
    rows = engine.store.history(reused)
    assert [(h.source, h.tokens) for h in rows[:2]] == [("ask1", 0), ("ask2", 11)]
    assert rows[0].detail["llm_calls"][0]["replayed"] is True
    assert "replayed" not in rows[1].detail["llm_calls"][0]
    assert done.tokens_used == 11 and llm.calls == 3  # only ask2's changed prompt was sent
    assert "(edited prompt)" in llm.requests[-1][0]["content"]
    again = asyncio.run(engine.run(fresh))
    assert again.tokens_used == 19 and llm.calls == 5  # a fresh fork calls for both
    assert sink.got == [(f"{iid}:notify:1", {"a1": "one", "a2": "two"})]  # never repeated


def test_redeliver_delivers_once_more_under_the_forks_own_key(engine_factory,
                                                              sink: Sink) -> None:
    engine = engine_factory(llm=Scripted.from_replies(REPLIES, model="m"))
    iid = _original(engine)
    quiet = engine.fork(iid, from_seq=1)
    assert asyncio.run(engine.run(quiet)).status == "completed"
    assert [k for k, _ in sink.got] == [f"{iid}:notify:1"]  # without --redeliver: nothing
    loud = engine.fork(iid, from_seq=1, redeliver=True)
    assert asyncio.run(engine.run(loud)).status == "completed"
    assert [k for k, _ in sink.got] == [f"{iid}:notify:1", f"{iid}>{loud}:notify:1"]
    [row] = engine.store.outbox(loud)
    assert (row.key, row.status) == (f"{iid}>{loud}:notify:1", "done")
    assert "delivered_by_original" not in engine.store.history(loud)[-2].detail


def test_a_fork_of_a_fork_never_delivers_what_the_first_of_its_line_delivered(
        engine_factory, sink: Sink) -> None:
    """Issue 36 item 6: a delivery made anywhere up the lineage counts as made."""
    engine = engine_factory(llm=Scripted.from_replies(REPLIES, model="m"))
    iid = _original(engine)
    first = engine.fork(iid, from_seq=1)  # never run: it never reached notify itself
    second = engine.fork(first, from_seq=1)
    assert asyncio.run(engine.run(second)).status == "completed"
    assert [k for k, _ in sink.got] == [f"{iid}:notify:1"]  # not again under first>second
    row = [h for h in engine.store.history(second) if h.source == "notify"][0]
    assert row.detail["delivered_by_original"] == f"{iid}:notify:1"
    third = engine.fork(second, from_seq=1)  # its parent took the original's outcome
    assert asyncio.run(engine.run(third)).status == "completed"
    assert [k for k, _ in sink.got] == [f"{iid}:notify:1"]
    loud = engine.fork(first, from_seq=1, redeliver=True)
    assert asyncio.run(engine.run(loud)).status == "completed"
    assert [k for k, _ in sink.got] == [f"{iid}:notify:1", f"{first}>{loud}:notify:1"]


def test_fsm_fork_flags(db_path: str, sink: Sink) -> None:
    from fsm_engine import Engine
    engine = Engine(db_path, llm=Scripted.from_replies(REPLIES, model="m"))
    iid = _original(engine)
    engine.close()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HELPERS}"}

    def fork(*flags: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "fork", iid, "--db",
                              db_path, "--from-seq", "1", *flags], capture_output=True,
                             text=True, cwd=ROOT, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        new = out.stdout.split(":")[0]
        shown = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "show", new, "--db",
                                db_path, "--json"], capture_output=True, text=True, cwd=ROOT,
                               env=env, timeout=60)
        return json.loads(shown.stdout)["fork_options"]
    assert fork("--reuse-llm", "--redeliver", "--as", "kim") == {
        "reuse_llm": True, "redeliver": True, "by": "kim"}
    assert fork("--fresh") == {"by": os.environ.get("USER") or "operator"}  # (the default)
