"""Streaming across real processes (issue 22): a worker process streams a scripted reply
chunk by chunk; an ``fsm stream`` subscriber in another process sees each chunk before
the step commits, in order with exact offsets; a SIGKILL mid-stream leaves the attempt
superseded by the new owner's, whose chunks are the reply the history keeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from procs import wait_until

from fsm_engine.store import open_store

pytestmark = pytest.mark.slow

WORKER = '''
"""Start instance s1 when missing, say "ready", resume everything."""
import asyncio, json, sys
from fsm_engine import Engine
from fsm_engine.llm import Scripted

cfg = json.load(open(sys.argv[1]))
eng = Engine(cfg["db"], llm=Scripted.from_replies(cfg["replies"], model="m"), seed=1)
eng.load(cfg["machine"])
if not any(r.id == "s1" for r in eng.store.list()):
    eng.start(cfg["machine"], {"topic": "streams"}, instance_id="s1")
print("ready", flush=True)
asyncio.run(eng.resume())
eng.close()
'''

MACHINE = '''
import asyncio, os
from typing import Any
from pydantic import BaseModel
from fsm_engine import Machine, State, Step, Transition


class Ctx(BaseModel):
    topic: str
    answer: str = ""


async def write(ctx: Ctx, step: Step) -> dict[str, Any]:
    reply = step.llm.stream([{"role": "user", "content": ctx.topic}], max_tokens=64)
    out = await reply.text()
    gate = os.environ.get("GATE")
    while gate and not os.path.exists(gate):  # the test opens it: the step commits after
        await asyncio.sleep(0.01)
    return {"answer": out.text}


machine = Machine(name="writer", context=Ctx, initial="write", states=[
    State("write", action=write), State("done", final=True)],
    transitions=[Transition("ok", "write", "done")])
'''

WORDS = [f"w{i:02d} " for i in range(24)]


class Procs:
    """A worker and a subscriber on one SQLite database in ``tmp``."""

    def __init__(self, tmp: Path, replies: list[dict[str, Any]]) -> None:
        self.tmp, self.db = tmp, str(tmp / "fsm.db")
        (tmp / "worker.py").write_text(WORKER)
        (tmp / "writer.py").write_text(MACHINE)
        (tmp / "cfg.json").write_text(json.dumps({
            "db": self.db, "machine": str(tmp / "writer.py"), "replies": replies}))
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.lines: list[dict[str, Any]] = []
        self.started: list[subprocess.Popen[str]] = []

    def worker(self, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, str(self.tmp / "worker.py"),
                                 str(self.tmp / "cfg.json")], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env={**self.env, **env})
        self.started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    def subscriber(self, *args: str) -> subprocess.Popen[str]:
        """``fsm stream s1 --json``; its events land in ``lines`` as they are printed."""
        proc = subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", "stream", "s1",
                                 "--db", self.db, "--json", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)
        self.started.append(proc)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines.append(json.loads(line))
        threading.Thread(target=read, daemon=True).start()
        return proc

    def chunks(self, attempt: tuple[int, int] | None = None) -> list[dict[str, Any]]:
        return [e for e in self.lines if e["kind"] == "chunk"
                and (attempt is None or (e["seq"], e["attempt"]) == attempt)]

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def procs(tmp_path: Path) -> Any:
    made: list[Procs] = []

    def make(replies: list[dict[str, Any]]) -> Procs:
        made.append(Procs(tmp_path, replies))
        return made[-1]
    yield make
    for p in made:
        p.close()


def _contiguous(chunks: list[dict[str, Any]]) -> str:
    """The chunks' text, checking each starts where the one before ended."""
    text = ""
    for c in chunks:
        assert c.get("char_offset", 0) == len(text), (c, len(text))
        text += c["text"]
    return text


def test_a_chunk_reaches_another_process_before_the_step_commits(procs: Any) -> None:
    p = procs([{"chunks": WORDS, "chunk_delay_s": 0.02, "completion_tokens": 24}])
    gate = p.tmp / "gate"
    worker = p.worker(GATE=str(gate))
    sub = p.subscriber()
    store = open_store(p.db)
    try:
        wait_until(lambda: any(e["kind"] == "end" for e in p.lines), 60,
                   "the whole reply in the subscriber", interval=0.005)
        assert store.get("s1").seq == 0  # the step has not committed: the gate is shut
        assert _contiguous(p.chunks()) == "".join(WORDS)
        gate.touch()
        assert sub.wait(60) == 0 and worker.wait(60) == 0
        reply = store.history("s1")[0].detail["llm_calls"][0]["reply"]
    finally:
        store.close()
    assert _contiguous(p.chunks()) == "".join(WORDS) == reply
    log = [e for e in p.lines if e["kind"] not in ("step", "final")]
    assert [e["offset"] for e in log] == list(range(len(log)))  # every position, in order
    assert [e["kind"] for e in p.lines][-3:] == ["end", "step", "final"]
    assert (p.lines[-2]["trigger"], p.lines[-2]["dest"]) == ("ok", "done")


def test_a_sigkill_mid_stream_supersedes_the_attempt_and_the_new_owner_finishes(
        procs: Any) -> None:
    p = procs([{"chunks": WORDS, "chunk_delay_s": 0.1, "completion_tokens": 24}])
    first = p.worker()
    sub = p.subscriber()
    wait_until(lambda: len(p.chunks()) >= 3, 60, "three chunks", interval=0.005)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    p.worker()  # adopts s1 from the dead pid at once and reruns the step
    assert sub.wait(90) == 0, sub.stderr.read() if sub.stderr else ""
    [gone] = [e for e in p.lines if e["kind"] == "superseded"]
    assert (gone["seq"], gone["attempt"]) == (1, 1)
    new = tuple(gone["by"])
    assert new == (2, 1)  # the takeover's recovery row is seq 1: the rerun is step 2
    assert not [e for e in p.lines if e["kind"] == "end" and (e["seq"], e["attempt"]) == (1, 1)]
    cut = _contiguous(p.chunks((1, 1)))
    assert cut and cut != "".join(WORDS)  # the killed attempt never looked complete
    survived = _contiguous(p.chunks(new))
    store = open_store(p.db)
    try:
        rows = store.history("s1")
    finally:
        store.close()
    assert [r.kind for r in rows] == ["recovery", "transition"]
    assert rows[-1].detail["llm_calls"][-1]["reply"] == survived == "".join(WORDS)
    steps = [(e["seq"], e.get("step_kind")) for e in p.lines if e["kind"] == "step"]
    assert steps == [(1, "recovery"), (2, "transition")]
    assert p.lines[-1] == {**p.lines[-1], "kind": "final", "status": "completed"}
