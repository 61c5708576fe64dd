"""A takeover while a parent joins never re-runs its finished children (issue 19, finding 1).

A Map over three items whose children deliver a side effect; the reducer SIGKILLs its own
process the first time it runs (a real SIGKILL, in the process stepping the parent), then
another process takes the parent over.  Before the fix the takeover row moved the parent's
``seq``, children's ids derived from it, and the new owner started a second family: every
child action ran twice and the sink got each item under two keys.  Asserted on SQLite and
PostgreSQL, through ``fsm run`` + ``fsm resume`` and through two ``fsm worker``s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from procs import stop

from fsm_engine.store import open_store

pytestmark = pytest.mark.slow

MACHINE = '''
import os, signal
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition
from fsm_engine.definition.fanout import Map
from fsm_engine.sinks import append_jsonl


class Item(BaseModel):
    n: int
    sent: bool = False


def deliver(ctx, step):
    with open(os.environ["JT_RUNS"], "a") as fh:  # one line per run of the child action
        fh.write(step.instance_id + "\\n")
    append_jsonl(os.environ["JT_SINK"], {"n": ctx.n}, step.idempotency_key)
    return {"sent": True}


item = Machine(name="item", context=Item, initial="send", states=[
    State("send", action=deliver, side_effect=True), State("done", final=True)],
    transitions=[Transition("ok", "send", "done")])


def reduce(outputs):
    marker = os.environ["JT_KILL"]
    if not os.path.exists(marker):  # the first join dies here, once
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return [o["n"] for o in outputs]


class Job(BaseModel):
    ns: list[int] = []
    got: list[int] = []


machine = Machine(name="jt", context=Job, initial="fan", states=[
    State("fan", fan_out=Map(items="ns", machine=item, item_field="n", into="got",
                             reducer=reduce)),
    State("done", final=True)],
    transitions=[Transition("joined", "fan", "done")])
'''

ITEMS = [3, 5, 7]


class Case:
    """One test's files: the machine module, its input, the counters it writes."""

    def __init__(self, tmp: Path, db: str) -> None:
        self.tmp, self.db = tmp, db
        self.module = tmp / "jt_machine.py"
        self.module.write_text(MACHINE)
        self.input = tmp / "in.json"
        self.input.write_text(json.dumps({"ns": ITEMS}))
        self.runs, self.sink, self.marker = tmp / "runs.txt", tmp / "sink.jsonl", tmp / "kill"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "JT_RUNS": str(self.runs),
                    "JT_SINK": str(self.sink), "JT_KILL": str(self.marker),
                    "FSM_MACHINES_ROOT": str(tmp)}  # resume / workers import only from there

    def fsm(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fsm_engine.cli", *args, "--db", self.db],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def worker(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "fsm_engine.cli", "worker", "--db", self.db, "--lease", "1",
             "--poll", "0.05", "--grace", "1"], env=self.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)

    def audit(self) -> None:
        """Each child action ran once, one child per item, each item delivered once under
        one key, and the parent joined once with every item."""
        store = open_store(self.db)
        try:
            parent = next(r for r in store.list() if r.parent_id is None)
            kids = store.children(parent.id)
            rows = store.history(parent.id)
        finally:
            store.close()
        assert any(r.kind == "recovery" for r in rows), "the kill left no takeover"
        runs = self.runs.read_text().split()
        assert len(runs) == len(ITEMS) == len(set(runs)), runs  # each child action ran once
        assert sorted(k.branch for k in kids) == ["0", "1", "2"], [k.id for k in kids]
        lines = [json.loads(line) for line in self.sink.read_text().splitlines()]
        assert sorted(d["n"] for d in lines) == ITEMS, lines  # each item once
        assert len({d["idempotency_key"] for d in lines}) == len(ITEMS)
        assert (parent.status, parent.context["got"]) == ("completed", ITEMS)
        assert [r.kind for r in rows].count("join") == 1


def test_reducer_killed_then_resume(tmp_path: Path, store_url: str) -> None:
    case = Case(tmp_path, store_url)
    first = case.fsm("run", str(case.module), "--input", str(case.input), "--local", "-q")
    assert first.returncode == -9, first.stderr[-2000:]  # the reducer's SIGKILL
    assert case.marker.exists() and len(case.runs.read_text().split()) == len(ITEMS)
    again = case.fsm("resume", "-q")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    case.audit()


def _wait_final(db: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        store = open_store(db)
        try:
            if any(r.parent_id is None and r.final for r in store.list()):
                return
        finally:
            store.close()
        time.sleep(0.1)
    raise AssertionError("the parent did not finish")


def test_worker_killed_holding_woken_parent(tmp_path: Path, store_url: str) -> None:
    case = Case(tmp_path, store_url)
    started = case.fsm("start", str(case.module), "--input", str(case.input))
    assert started.returncode == 0, started.stderr
    first = case.worker()  # runs the children, claims the woken parent, dies in its join
    try:
        assert first.wait(60) == -9, first.stderr.read() if first.stderr else ""
    finally:
        if first.poll() is None:
            first.kill()
        if first.stderr:
            first.stderr.close()
    second = case.worker()  # takes the parent over
    try:
        _wait_final(case.db)
    finally:
        stop(second)
        if second.stderr:
            second.stderr.close()
    case.audit()
