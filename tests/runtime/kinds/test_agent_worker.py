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
from typing import Any

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


def _slow(reply: dict[str, Any], delay: float) -> dict[str, Any]:
    """``reply`` (a ``KEYED`` line) streamed three characters at a time, ``delay`` s apart."""
    text = reply.get("text") or json.dumps({"tool_calls": reply["tool_calls"]})
    line = {k: v for k, v in reply.items() if k not in ("text", "tool_calls")}
    return {**line, "chunks": [text[n:n + 3] for n in range(0, len(text), 3)],
            "chunk_delay_s": delay}


def test_a_worker_sigkilled_mid_turn_leaves_the_turn_superseded_and_its_rerun_readable(
        store_url: str, tmp_path: Path) -> None:
    """Issue 36: an agent turn streams; the worker is SIGKILLed while the first turn's
    pieces are being written; the worker taking the instance over asks the turn again, its
    attempt superseding the cut one, and every turn's stream is the reply its row keeps."""
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps(_slow(r, 0.05)) + "\n" for r in KEYED))
    env = {**os.environ, "FSM_DB": store_url, "AGENT_SINK": str(tmp_path / "sink.jsonl")}
    (tmp_path / "q.json").write_text(json.dumps({"question": "what is 2 + 3?"}))
    iid = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "start", MODULE, "--input",
                          str(tmp_path / "q.json")], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    cmd = [sys.executable, "-m", "fsm_engine.cli", "worker", "--lease", "1", "--poll", "0.2",
           "--llm", f"scripted:{script}"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = None
    store = open_store(store_url)
    try:
        wait_until(lambda: sum(r.kind == "chunk" for r in store.stream_read(iid)) >= 3, 60,
                   "three chunks of the first turn", interval=0.01)
        first.kill()  # SIGKILL, mid-turn
        first.wait(10)
        assert store.get(iid).seq == 0  # nothing of the turn journaled
        cut = "".join(r.text for r in store.stream_read(iid) if r.kind == "chunk")
        second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_until(lambda: store.get(iid).final, 120, "the second worker to finish the loop")
        rec, rows, log = store.get(iid), store.history(iid), store.stream_read(iid)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        store.close()
    assert (rec.state, rec.context["answer"]) == ("answered", "5")
    assert [r.kind for r in rows][0] == "recovery"
    replies = {r.seq: r.detail["llm_calls"][-1]["reply"] for r in rows
               if r.detail.get("llm_calls")}
    assert len(replies) == 3
    attempts: dict[tuple[int, int], list[str]] = {}
    for r in log:
        attempts.setdefault((r.seq, r.attempt), []).append(r.kind)
    killed = [a for a, kinds in attempts.items() if "end" not in kinds]
    assert killed == [(1, 1)] and "superseded" in attempts[(1, 1)]  # the cut turn
    assert cut and cut != replies[2]  # the killed attempt never looked complete
    text = {a: "".join(r.text for r in log if (r.seq, r.attempt) == a and r.kind == "chunk")
            for a in attempts if a != (1, 1)}
    assert text == {(seq, 1): reply for seq, reply in replies.items()}  # rerun: step 2
    assert min(replies) == 2  # the takeover's recovery row is seq 1
