"""``fsm check`` reports the runtime's invariants (issue 19): duplicate children for one
item, a parent waiting on children all final, an outbox key delivered twice, a history
that does not replay to its row — each with the instance id and a one-line reason — and
says ok for a healthy store.  Each violation is made for real on SQLite and PostgreSQL:
what the pre-fix runtime wrote (a second family after a takeover; a decision ending a
child without waking its parent), or rows written straight through the store."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from review_family_source import MACHINE as REVIEW_FAMILY

from fsm_engine import Engine
from fsm_engine.runtime.kinds import reviews
from fsm_engine.runtime.loader import load_machine
from fsm_engine.store.records import HistoryRow, ReviewDecision, StepCommit

#: On a runtime that never wakes a decided family's parent, its run waits forever.
pytestmark = pytest.mark.timeout(120)

SIDE_EFFECT = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    n: int = 0


def send(ctx, step):
    return {"n": ctx.n + 1}


machine = Machine(name="ci_send", context=Ctx, initial="send", states=[
    State("send", action=send, side_effect=True), State("done", final=True)],
    transitions=[Transition("ok", "send", "done")])
'''


def _check(db: str) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "check", "--db", db,
                           "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)["problems"]


def _family(eng: Engine, tmp: Path) -> str:
    """A parent waiting on two children waiting in review (a healthy family)."""
    path = tmp / "rf_machine.py"
    path.write_text(REVIEW_FAMILY)
    machine, _ = load_machine(str(path))
    pid = eng.start(machine, {"ns": [1, 2]})

    async def go() -> None:
        await eng.step(pid)  # the parent starts its family and waits
        for kid in eng.store.children(pid):
            assert (await eng.run(kid.id)).state == "review"
    asyncio.run(go())
    rec = eng.store.get(pid)
    assert (rec.status, rec.reason) == ("waiting", "children")
    return pid


def _sent(eng: Engine, tmp: Path) -> str:
    path = tmp / "ci_send.py"
    path.write_text(SIDE_EFFECT)
    machine, _ = load_machine(str(path))
    iid = eng.start(machine, {})
    assert asyncio.run(eng.run(iid)).status == "completed"
    return iid


def _healthy(engine_factory: Any, tmp: Path) -> tuple[Engine, str, str]:
    eng = engine_factory()
    return eng, _family(eng, tmp), _sent(eng, tmp)


def test_a_healthy_store_is_ok(engine_factory: Any, store_url: str, tmp_path: Path) -> None:
    eng, pid, _ = _healthy(engine_factory, tmp_path)
    for kid in eng.store.children(pid):  # decided: the family joins
        (item,) = eng.reviews(instance_id=kid.id)
        eng.decide(item, "approve", by="ann")
    assert asyncio.run(eng.run(pid)).status == "completed"
    _family(eng, tmp_path)  # and one left waiting in review
    assert _check(store_url) == (0, [])


def test_the_fleet_is_ok(fleet: Any) -> None:
    """Real finished instances of three machines (retries, fallbacks, side effects)."""
    db = fleet if isinstance(fleet, str) else fleet.db
    assert _check(db) == (0, [])


def _second_family(eng: Engine, pid: str) -> None:
    """What the pre-fix runtime wrote on a takeover of the waiting parent: a recovery row,
    then the whole family again under the moved seq."""
    parent = eng.store.get(pid)
    row = HistoryRow(pid, parent.seq + 1, parent.state, parent.state, "recovery",
                     parent.updated_at, kind="recovery", detail={"recovery": {}})
    moved = replace(parent, seq=parent.seq + 1, visits=dict(parent.visits))
    assert eng.store.commit([StepCommit(moved, parent.version, [row], before=parent)]) == [True]
    again = [replace(k, id=k.id.replace(f"{pid}.0.", f"{pid}.1."), key=None, version=0,
                     seq=0, state="look", status="pending", visits={"look": 1})
             for k in eng.store.children(pid)]
    eng.store.create(*again)


def test_duplicate_children_reported(engine_factory: Any, store_url: str,
                                     tmp_path: Path) -> None:
    eng, pid, _ = _healthy(engine_factory, tmp_path)
    _second_family(eng, pid)
    code, problems = _check(store_url)
    assert code == 1
    assert [p for p in problems if "duplicate children" in p] == [
        f"instance {pid}: duplicate children: 2 families ({pid}.0.*, {pid}.1.*) started for "
        "one visit of its fan-out state"], problems


def test_never_woken_parent_reported(engine_factory: Any, store_url: str,
                                     tmp_path: Path) -> None:
    eng, pid, _ = _healthy(engine_factory, tmp_path)
    for kid in eng.store.children(pid):  # written as Engine.decide did before the ledger:
        (item,) = eng.reviews(instance_id=kid.id)  # the child ends, its parent is not woken
        step = reviews.decision(eng.definition(kid), kid, item, "approve", by="ann",
                                now=time.time(), advance=eng.driver.advance, claimer="ann")
        assert step.record.final and eng.store.commit([step]) == [True]
    code, problems = _check(store_url)
    assert code == 1 and problems == [
        f"instance {pid}: waiting on its children, but all 2 are final (never woken)"], problems


def test_outbox_key_delivered_twice_reported(engine_factory: Any, store_url: str,
                                             tmp_path: Path) -> None:
    eng, _, iid = _healthy(engine_factory, tmp_path)
    rec = eng.store.get(iid)
    (first,) = [r for r in eng.store.history(iid) if "idempotency_key" in r.detail]
    again = replace(first, seq=rec.seq + 1, source="done", dest="done", delta={},
                    detail=dict(first.detail))
    moved = replace(rec, seq=rec.seq + 1, visits=dict(rec.visits))
    assert eng.store.commit([StepCommit(moved, rec.version, [again], before=rec)]) == [True]
    code, problems = _check(store_url)
    key = first.detail["idempotency_key"]
    assert code == 1 and problems == [
        f"instance {iid}: outbox key {key} delivered twice (history rows {iid}#{first.seq}, "
        f"{iid}#{again.seq})"], problems


def test_history_not_replaying_reported(engine_factory: Any, store_url: str,
                                        tmp_path: Path) -> None:
    eng, _, iid = _healthy(engine_factory, tmp_path)
    rec = eng.store.get(iid)
    edited = replace(rec, context={**rec.context, "n": 41}, tokens_used=0,
                     visits=dict(rec.visits))
    assert eng.store.commit([StepCommit(edited, rec.version, before=rec)]) == [True]
    code, problems = _check(store_url)
    assert code == 1 and problems == [
        f"instance {iid}: history does not replay to the row: context field(s) n differ "
        "from the input with the deltas applied"], problems


def test_a_wait_nothing_can_end_reported(engine_factory: Any, store_url: str,
                                         tmp_path: Path) -> None:
    """Issue 36 item 1: what the pre-fix runtime wrote for a fork of an agent waiting for a
    tool call's approval (the fork waiting, its copied ask row naming the original's item),
    and a review state's wait whose item was decided without its step: both reported; the
    original, waiting on its own open item, is not."""
    import agent_machine
    from agent_replies import calls, final

    from fsm_engine.llm import Scripted
    asks = [calls(("add", {"a": 2, "b": 3})), calls(("send_report", {"text": "5"})),
            final("reported")]
    eng = engine_factory(llm=Scripted.from_replies(asks))
    iid = eng.start(agent_machine.approved, {"question": "report 2 + 3"})
    assert asyncio.run(eng.run(iid)).status == "waiting"
    asked = [h.seq for h in eng.store.history(iid) if h.detail.get("agent") == "ask"]
    fork = eng.store.get(eng.fork(iid, from_seq=asked[-1]))
    stuck = replace(fork, status="waiting", owner=None, visits=dict(fork.visits))
    assert eng.store.commit([StepCommit(stuck, fork.version, before=fork)]) == [True]
    pid = _family(eng, tmp_path)
    kid = eng.store.children(pid)[0]
    (kid_item,) = eng.reviews(instance_id=kid.id)  # decided, its instance left waiting
    closed = ReviewDecision(kid_item.id, "ann", time.time(), "approve")
    assert eng.store.commit([StepCommit(replace(kid, visits=dict(kid.visits)), kid.version,
                                        before=kid, review_close=closed)]) == [True]
    code, problems = _check(store_url)
    assert code == 1 and sorted(problems) == sorted([
        f"instance {fork.id}: waiting in state 'research' on the approval of call 2.1 (tool "
        "send_report), but no open review item of this instance is there: nothing can end "
        "the wait",
        f"instance {kid.id}: waiting in state 'review' for a review, but no open review "
        "item of this instance is there: nothing can end the wait"]), problems
