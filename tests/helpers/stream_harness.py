"""Real processes for the streaming tests (issue 22): a worker process running one
instance ``s1`` of a machine whose action streams a scripted reply (and, with ``GATE``
set in its environment, holds the step's commit until that file exists; with ``START_GATE``,
its model call until that one exists), and
``fsm stream`` / ``fsm ui`` subprocesses watching it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

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
    start = os.environ.get("START_GATE")
    while start and not os.path.exists(start):  # the test opens it: the model starts writing
        await asyncio.sleep(0.01)
    reply = step.llm.stream([{"role": "user", "content": ctx.topic}], max_tokens=64)
    out = await reply.complete()
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

    def __init__(self, tmp: Path, replies: list[dict[str, Any]], db: str | None = None) -> None:
        self.tmp, self.db = tmp, db or str(tmp / "fsm.db")
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

    def viewer(self, token: str) -> str:
        """``fsm ui`` on the database (a free loopback port, ``token``); its base URL."""
        proc = subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", "ui", "--db", self.db,
                                 "--port", "0", "--token", token, "--refresh", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=self.env)
        self.started.append(proc)
        line = proc.stdout.readline() if proc.stdout else ""  # printed once it listens
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        return f"http://127.0.0.1:{match.group(1)}"

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture(name="procs")
def procs_fixture(tmp_path: Path) -> Iterator[Any]:
    made: list[Procs] = []

    def make(replies: list[dict[str, Any]], db: str | None = None) -> Procs:
        made.append(Procs(tmp_path, replies, db))
        return made[-1]
    yield make
    for p in made:
        p.close()


def contiguous(chunks: list[dict[str, Any]]) -> str:
    """The chunks' text, checking each starts where the one before ended."""
    text = ""
    for c in chunks:
        assert c.get("char_offset", 0) == len(text), (c, len(text))
        text += c["text"]
    return text
