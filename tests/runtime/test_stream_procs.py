"""Streaming across real processes (issue 22): a worker process streams a scripted reply
chunk by chunk; an ``fsm stream`` subscriber in another process sees each chunk before
the step commits, in order with exact offsets; a SIGKILL mid-stream leaves the attempt
superseded by the new owner's, whose chunks are the reply the history keeps."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from procs import wait_until
from stream_harness import WORDS, contiguous, procs_fixture  # noqa: F401 - the fixture

from fsm_engine.store import open_store

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_chunk_reaches_another_process_before_the_step_commits(
        procs: Any, backend: str, request: pytest.FixtureRequest) -> None:
    db = request.getfixturevalue("pg_cluster").database() if backend == "postgres" else None
    p = procs([{"chunks": WORDS, "chunk_delay_s": 0.02, "completion_tokens": 24}], db)
    gate = p.tmp / "gate"
    worker = p.worker(GATE=str(gate))
    sub = p.subscriber()
    store = open_store(p.db)
    try:
        wait_until(lambda: any(e["kind"] == "end" for e in p.lines), 60,
                   "the whole reply in the subscriber", interval=0.005)
        assert store.get("s1").seq == 0  # the step has not committed: the gate is shut
        assert contiguous(p.chunks()) == "".join(WORDS)
        gate.touch()
        assert sub.wait(60) == 0 and worker.wait(60) == 0
        reply = store.history("s1")[0].detail["llm_calls"][0]["reply"]
    finally:
        store.close()
    assert contiguous(p.chunks()) == "".join(WORDS) == reply
    log = [e for e in p.lines if e["kind"] not in ("step", "final")]
    assert [e["offset"] for e in log] == list(range(len(log)))  # every position, in order
    assert [e["kind"] for e in p.lines][-3:] == ["end", "step", "final"]
    assert (p.lines[-2]["trigger"], p.lines[-2]["dest"]) == ("ok", "done")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_sigkill_mid_stream_supersedes_the_attempt_and_the_new_owner_finishes(
        procs: Any, backend: str, request: pytest.FixtureRequest) -> None:
    db = request.getfixturevalue("pg_cluster").database() if backend == "postgres" else None
    p = procs([{"chunks": WORDS, "chunk_delay_s": 0.1, "completion_tokens": 24}], db)
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
    cut = contiguous(p.chunks((1, 1)))
    assert cut and cut != "".join(WORDS)  # the killed attempt never looked complete
    survived = contiguous(p.chunks(new))
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


def test_a_cli_run_killed_mid_stream_in_its_first_step_is_superseded_after_resume(
        tmp_path: Any) -> None:
    """``fsm run`` SIGKILLed while its first step streams (the instance still ``pending``:
    the takeover does not count as mid-step), then ``fsm resume``: the rerun's attempt
    supersedes the killed one, so the log never shows the cut reply as live or complete
    (it used to stay open for good: the supersede range followed the mid-step count)."""
    import json
    import subprocess
    import sys

    from conftest import ROOT
    from stream_harness import MACHINE
    (tmp_path / "writer.py").write_text(MACHINE)
    (tmp_path / "in.json").write_text(json.dumps({"topic": "streams"}))
    (tmp_path / "s.jsonl").write_text(json.dumps(
        {"chunks": WORDS, "chunk_delay_s": 0.1, "completion_tokens": 24}) + "\n")
    db = str(tmp_path / "fsm.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "fsm_engine.cli"]
    first = subprocess.Popen([*cli, "run", "writer.py", "--input", "in.json", "--db", db,
                              "--llm", "scripted:s.jsonl", "-q"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = None  # (opened once the run made it)
    try:
        wait_until(lambda: os.path.exists(db), 60, "the database", interval=0.01)
        store = open_store(db)
        wait_until(lambda: sum(r.kind == "chunk" for r in store.stream_read(
            store.list()[0].id)) >= 3 if store.list() else False, 60, "three chunks",
            interval=0.01)
        iid = store.list()[0].id
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        done = subprocess.run([*cli, "resume", "--db", db, "--llm", "scripted:s.jsonl", "-q"],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        rec, log = store.get(iid), store.stream_read(iid)
    finally:
        if first.poll() is None:
            first.kill()
        if store is not None:
            store.close()
    assert rec.status == "completed" and rec.context["answer"] == "".join(WORDS)
    opened = [(r.seq, r.attempt) for r in log if r.kind == "open"]
    ended = {(r.seq, r.attempt) for r in log if r.kind == "end"}
    superseded = {(r.seq, r.attempt): tuple(r.info["by"]) for r in log if r.kind == "superseded"}
    cut, last = opened[0], opened[-1]
    assert cut != last and cut not in ended and superseded.get(cut) == last
    assert last in ended and "".join(r.text for r in log if r.kind == "chunk"
                                     and (r.seq, r.attempt) == last) == "".join(WORDS)
