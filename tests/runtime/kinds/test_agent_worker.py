"""An agent loop under ``fsm worker`` on both backends (issue 23): the worker running it is
SIGKILLed mid-loop (inside a tool), another worker takes it over and finishes it; the
calls journaled before the kill never run again, the side effect is delivered once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from agent_replies import KEYED
from procs import alive, wait_until

from fsm_engine.store import open_store
from fsm_engine.store.records import TOOL

pytestmark = pytest.mark.slow  # real processes SIGKILLed

HERE = Path(__file__).resolve().parents[2] / "helpers"
MODULE = str(HERE / "agent_machine.py")


def test_a_worker_sigkilled_mid_loop_is_taken_over(store_url: str, tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in KEYED))
    env = {**os.environ, "FSM_DB": store_url, "AGENT_TOOL_LOG": str(tmp_path / "tools.jsonl"),
           "AGENT_SINK": str(tmp_path / "sink.jsonl"),
           "AGENT_KILL_IN_DONE": str(tmp_path / "killed")}
    (tmp_path / "q.json").write_text(json.dumps({"question": "what is 2 + 3?"}))
    iid = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "start", MODULE, "--input",
                          str(tmp_path / "q.json")], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    cmd = [sys.executable, "-m", "fsm_engine.cli", "worker", "--lease", "1", "--poll", "0.2",
           "--llm", f"scripted:{script}"]
    first = subprocess.Popen(cmd, env={**env, "AGENT_KILL_IN": "send_report"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = None
    store = open_store(store_url)
    try:
        wait_until(lambda: not alive(first.pid), 60, "the first worker to die in send_report")
        first.wait(10)
        assert first.returncode == -9
        journaled = [r.detail["tool"] for r in store.history(iid)
                     if r.kind == TOOL and r.detail.get("agent") == "call"]
        assert journaled == ["add", "echo", "echo"]  # killed inside the fourth call
        second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_until(lambda: store.get(iid).final, 60, "the second worker to finish the loop")
        rec = store.get(iid)
        assert (rec.state, rec.context["answer"]) == ("answered", "5")
        runs = Counter(json.loads(x)["tool"] for x in
                       (tmp_path / "tools.jsonl").read_text().splitlines())
        assert runs == {"add": 1, "echo": 2, "send_report": 2}  # killed once inside it
        [sent] = (tmp_path / "sink.jsonl").read_text().splitlines()
        [box] = store.outbox(iid)
        assert (box.status, box.attempts, json.loads(sent)["key"]) == ("done", 2, box.key)
        assert any(r.kind == "recovery" for r in store.history(iid))
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        store.close()
