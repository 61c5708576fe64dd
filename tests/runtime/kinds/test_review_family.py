"""Reviews inside a family (issue 19, finding 2): a decision that ends a fan-out child wakes
its parent, and a parent whose children wait in review is left waiting (``run`` returns,
``fsm run`` exits 3) instead of re-running the waiting children forever.  On SQLite and
PostgreSQL, in process and through real ``fsm run`` / ``fsm resume`` subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from review_family_source import MACHINE

from fsm_engine import Engine
from fsm_engine.runtime.loader import load_machine

ITEMS = [1, 2]


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "rf_machine.py"
    path.write_text(MACHINE)
    return path


def _approve_all(eng: Engine, parent_id: str) -> None:
    for kid in eng.store.children(parent_id):
        (item,) = eng.reviews(instance_id=kid.id)
        done = eng.decide(item, "approve", by="ann")
        assert done.status == "completed"


async def _family_in_review(eng: Engine, module: Path) -> str:
    machine, ref = load_machine(str(module))
    pid = eng.start(machine, {"ns": ITEMS})
    rec = await asyncio.wait_for(eng.run(pid), 20)  # before the fix: never returned
    assert (rec.status, rec.reason) == ("waiting", "children")
    kids = eng.store.children(pid)
    assert [(k.status, k.state) for k in kids] == [("waiting", "review")] * len(ITEMS)
    assert all(len(eng.store.history(k.id)) == 1 for k in kids)  # each stepped once
    return pid


@pytest.mark.timeout(60)  # before the fix: the run spun on its waiting children forever
def test_run_leaves_the_parent_waiting(engine_factory: Any, module: Path) -> None:
    eng = engine_factory()
    asyncio.run(_family_in_review(eng, module))


@pytest.mark.timeout(60)
def test_decision_ending_a_child_wakes_its_parent(engine_factory: Any, module: Path) -> None:
    eng = engine_factory()
    machine, ref = load_machine(str(module))
    pid = eng.start(machine, {"ns": ITEMS})

    async def go() -> None:
        await eng.step(pid)  # the parent starts its family and waits
        for kid in eng.store.children(pid):
            assert (await eng.run(kid.id)).state == "review"
    asyncio.run(go())
    assert eng.store.get(pid).status == "waiting"
    _approve_all(eng, pid)
    parent = eng.store.get(pid)
    assert (parent.status, parent.reason) == ("running", "children")  # woken: claimable
    assert [r.id for r in eng.resumable()] == [pid]
    done = asyncio.run(eng.run(pid))
    assert (done.status, [g["n"] for g in done.context["got"]]) == ("completed", ITEMS)


def _cli(tmp: Path, db: str, *args: str, timeout: float = 30.0
         ) -> tuple[subprocess.CompletedProcess[str], float]:
    """``fsm ARGS --db DB``, and the CPU seconds it used."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "fsm_engine.cli", *args, "--db", db],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, cpu


def test_fsm_run_exits_3_then_resume_joins(tmp_path: Path, store_url: str,
                                           module: Path) -> None:
    data = tmp_path / "in.json"
    data.write_text(json.dumps({"ns": ITEMS}))
    run, cpu = _cli(tmp_path, store_url, "run", str(module), "--input", str(data), "--local",
                    "-q")  # before the fix: still spinning at the timeout
    assert run.returncode == 3, run.stdout[-2000:] + run.stderr[-2000:]
    assert cpu < 10.0, f"fsm run used {cpu:.1f} s of CPU"
    eng = Engine(store_url)
    try:
        (parent,) = [r for r in eng.store.list() if r.parent_id is None]
        assert (parent.status, parent.reason) == ("waiting", "children")
        assert all(len(eng.store.history(k.id)) == 1 for k in eng.store.children(parent.id))
        eng.load(str(module))
        _approve_all(eng, parent.id)
        assert eng.store.get(parent.id).status == "running"
    finally:
        eng.close()
    again, _ = _cli(tmp_path, store_url, "resume", "-q")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    eng = Engine(store_url)
    try:
        done = eng.store.get(parent.id)
        assert (done.status, [g["n"] for g in done.context["got"]]) == ("completed", ITEMS)
    finally:
        eng.close()


@pytest.mark.timeout(60)
def test_a_failed_join_closes_the_review_of_the_child_it_cancels(engine_factory: Any,
                                                                 module: Path) -> None:
    """Issue 36 (friction): one child rejected fails the join, which cancels its sibling
    still waiting in review; that sibling's item was left ``open`` for good (listed,
    claimable, never decidable), it is now closed undecided in the cancel's write."""
    eng = engine_factory()
    pid = asyncio.run(_family_in_review(eng, module))
    first, second = eng.store.children(pid)
    (item,) = eng.reviews(instance_id=first.id)
    eng.decide(item, "reject", by="ann")
    asyncio.run(eng.resume())
    assert eng.store.get(pid).status == "failed"
    assert eng.store.get(second.id).status == "cancelled"
    assert eng.reviews() == []  # nothing left open
    (closed,) = eng.reviews(status="closed", instance_id=second.id)
    assert (closed.decided_by, closed.note) == ("fsm", "instance cancelled: join")
