"""A runner process for the crash tests: ``RUNNER`` (a script) starts the configured
instances that are missing, says "ready", resumes everything; ``Runner`` launches it on
one database, ``kill`` SIGKILLs one launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT

RUNNER = '''
"""Start the configured instances that are missing, say "ready", resume everything."""
import asyncio, json, sys
from fsm_engine import Engine
from fsm_engine.llm import Scripted

cfg = json.load(open(sys.argv[1]))
eng = Engine(cfg["db"], llm=Scripted.from_replies(cfg["replies"], model="m"), seed=1,
             **cfg.get("engine", {}))
eng.load(cfg["machine"])  # a row's module is imported only when named, or under the root
have = {r.id for r in eng.store.list()}
for i, data in enumerate(cfg["inputs"]):
    if f"i{i:04d}" not in have:
        eng.start(cfg["machine"], data, instance_id=f"i{i:04d}")
print("ready", flush=True)
asyncio.run(eng.resume())
eng.close()
'''


class Runner:
    """Launches the runner script on one database with one configuration."""

    def __init__(self, tmp: Path, machine: str, inputs: list[dict], replies: list[dict],
                 env: dict[str, str] | None = None, **engine: Any) -> None:
        self.tmp, self.db = tmp, str(tmp / "fsm.db")
        (tmp / "runner.py").write_text(RUNNER)
        cfg = {"db": self.db, "machine": machine, "inputs": inputs, "replies": replies,
               "engine": engine}
        (tmp / "cfg.json").write_text(json.dumps(cfg))
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.launches = 0
        self.pids: list[int] = []

    def launch(self, wait_ready: bool = True) -> subprocess.Popen:
        self.launches += 1
        err = open(self.tmp / f"stderr.{self.launches}", "w")
        proc = subprocess.Popen([sys.executable, str(self.tmp / "runner.py"),
                                 str(self.tmp / "cfg.json")], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=self.env)
        self.pids.append(proc.pid)
        err.close()
        if wait_ready:
            assert proc.stdout.readline().strip() == "ready", self.stderr()
        return proc

    def stderr(self) -> str:
        return (self.tmp / f"stderr.{self.launches}").read_text()[-3000:]

    def finish(self, timeout: float = 90.0) -> None:
        """Run once more without a kill; it must exit cleanly."""
        proc = self.launch()
        assert proc.wait(timeout) == 0, self.stderr()
        proc.stdout.close()


def kill(proc: subprocess.Popen) -> bool:
    """SIGKILL ``proc``; True when it was still running (the kill interrupted work)."""
    alive = proc.poll() is None
    if alive:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    return alive
