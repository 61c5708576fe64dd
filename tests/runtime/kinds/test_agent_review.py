"""Approval of an agent's tool calls (issue 23): the call waits in the review queue, holding
no worker; reject takes ``rejected``, approve (with edited arguments) runs the tool with
them; the SLA timer takes its choice once, across a SIGKILL of the worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import agent_machine
import pytest
from agent_replies import calls, final
from procs import wait_until

from fsm_engine import Engine
from fsm_engine.errors import ReviewRefused
from fsm_engine.llm import Scripted
from fsm_engine.store import open_store

HERE = Path(__file__).resolve().parents[2] / "helpers"
MODULE = str(HERE / "agent_machine.py")
Q = {"question": "report 2 + 3"}
ASK = [calls(("add", {"a": 2, "b": 3})), calls(("send_report", {"text": "2+3=5"})),
       final("reported")]


def _to_review(engine: Engine) -> str:
    iid = engine.start(agent_machine.approved, Q)
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.state, rec.owner) == ("waiting", "research", None)
    return iid


def _ran(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    log, sink = tmp_path / "tools.jsonl", tmp_path / "sink.jsonl"
    monkeypatch.setenv("AGENT_TOOL_LOG", str(log))
    monkeypatch.setenv("AGENT_SINK", str(sink))
    return log, sink


def test_reject_takes_the_rejected_outcome_and_the_tool_never_runs(
        engine_factory: Any, logs: tuple[Path, Path]) -> None:
    engine = engine_factory(llm=Scripted.from_replies(ASK))
    iid = _to_review(engine)
    [item] = engine.reviews()
    assert item.show == {"tool": "send_report", "arguments": {"text": "2+3=5"}, "turn": 2,
                         "call": "2.1"}
    assert item.editable == ["text"] and item.choices == ["approve", "reject"]
    rec = engine.decide(item, "reject", by="ann", note="not now")
    assert (rec.state, rec.status) == ("rejected", "completed")
    assert [r["tool"] for r in _ran(logs[0])] == ["add"]
    last = engine.store.history(iid)[-1]
    assert (last.trigger, last.kind, last.detail["review"]["by"]) == ("rejected", "review", "ann")
    assert engine.review(item.id).choice == "reject"


def test_approve_with_edited_arguments_runs_the_tool_with_the_edit(
        engine_factory: Any, logs: tuple[Path, Path]) -> None:
    engine = engine_factory(llm=Scripted.from_replies(ASK))
    iid = _to_review(engine)
    [item] = engine.reviews()
    with pytest.raises(ReviewRefused, match="edit rejected: invalid arguments"):
        engine.decide(item, "approve", by="ann", update={"text": 5})
    with pytest.raises(ReviewRefused, match="not editable"):
        engine.decide(item, "approve", by="ann", update={"to": "everyone"})
    rec = engine.decide(item, "approve", by="ann", update={"text": "2+3=5 (checked)"})
    assert (rec.status, rec.owner) == ("running", None)
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.context["answer"]) == ("answered", "reported")
    [sent] = [json.loads(x) for x in logs[1].read_text().splitlines()]
    assert sent["text"] == "2+3=5 (checked)"
    call = [r for r in engine.store.history(iid) if r.detail.get("agent") == "call"][-1]
    assert (call.detail["tool"], call.detail["arguments"]) == \
        ("send_report", {"text": "2+3=5 (checked)"})
    with pytest.raises(ReviewRefused, match="already decided"):
        engine.decide(item, "reject", by="bob")


def _fsm(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsm_engine.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=check)


def _script(tmp_path: Path) -> str:
    """``ASK`` keyed by what the prompt holds, so a new process's model goes on where the
    last one stopped."""
    keyed = [{**ASK[2], "match": '"result": "sent"'}, {**ASK[1], "match": '"result": 5'},
             ASK[0]]
    path = tmp_path / "script.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in keyed))
    return "scripted:" + str(path)


def test_cli_review_decide_with_an_edit_file(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    env = {**os.environ, "FSM_DB": db, "AGENT_SINK": str(tmp_path / "sink.jsonl")}
    (tmp_path / "q.json").write_text(json.dumps(Q))
    run = _fsm("run", MODULE + ":approved", "--input", str(tmp_path / "q.json"), "--llm",
               _script(tmp_path), env=env, check=False)
    assert run.returncode == 3, run.stderr  # waiting for a person
    [item] = json.loads(_fsm("review", "list", "--json", env=env).stdout)
    assert item["show"]["tool"] == "send_report"
    (tmp_path / "args.json").write_text(json.dumps({"text": "edited"}))
    (tmp_path / "bad.json").write_text(json.dumps({"text": ["no"]}))
    bad = _fsm("review", "decide", item["id"], "approve", "--edit", str(tmp_path / "bad.json"),
               env=env, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("fsm: error: review")
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    _fsm("review", "decide", item["id"], "approve", "--edit", str(tmp_path / "args.json"),
         env=env)
    _fsm("resume", "--llm", _script(tmp_path), env=env)
    [sent] = [json.loads(x) for x in (tmp_path / "sink.jsonl").read_text().splitlines()]
    assert sent["text"] == "edited"
    store = open_store(db)
    try:
        [rec] = store.list()
        assert (rec.state, rec.context["answer"]) == ("answered", "reported")
    finally:
        store.close()


def test_the_sla_timer_takes_its_choice_once_across_a_sigkilled_worker(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    env = {**os.environ, "FSM_DB": db, "AGENT_SLA_S": "2",
           "AGENT_TOOL_LOG": str(tmp_path / "tools.jsonl")}
    (tmp_path / "q.json").write_text(json.dumps(Q))
    iid = _fsm("start", MODULE + ":approved", "--input", str(tmp_path / "q.json"),
               env=env).stdout.strip()
    worker_cmd = [sys.executable, "-m", "fsm_engine.cli", "worker", "--lease", "1", "--llm",
                  _script(tmp_path)]
    store = open_store(db)
    worker = subprocess.Popen(worker_cmd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: store.get(iid).status == "waiting", 60, "the call put to review")
        worker.send_signal(signal.SIGKILL)  # killed while the timer runs
        worker.wait(10)
        worker = subprocess.Popen(worker_cmd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_until(lambda: store.get(iid).final, 60, "the SLA timer's decision")
        rec = store.get(iid)
        assert (rec.state, rec.status) == ("rejected", "completed")
        _fsm("resume", "--llm", _script(tmp_path), env=env, check=False)  # nothing to fire
        rows = [h for h in store.history(iid) if h.kind == "review"]
        assert len(rows) == 1 and rows[0].detail["review"]["by"] == "sla-timer"
        [item] = store.reviews()
        assert (item.status, item.choice, item.decided_by) == ("decided", "reject", "sla-timer")
        assert [json.loads(x)["tool"] for x in (tmp_path / "tools.jsonl").read_text()
                .splitlines()] == ["add"]
    finally:
        worker.kill()
        worker.wait(10)
        store.close()


def test_an_sla_approval_goes_on_in_the_same_run(engine_factory: Any,
                                                  logs: tuple[Path, Path]) -> None:
    m = agent_machine._machine("agent-sla-approve", agent_machine.Agent(
        tools=agent_machine.TOOLS, output=agent_machine.Answer, max_turns=4,
        approve=["send_report"], sla_s=30, on_timeout="approve"), max_transitions=30)
    clock = [1000.0]
    engine = engine_factory(llm=Scripted.from_replies(ASK), clock=lambda: clock[0])
    iid = engine.start(m, Q)
    assert asyncio.run(engine.run(iid)).status == "waiting"
    clock[0] += 31  # the SLA passes
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.context["answer"]) == ("answered", "reported")
    [item] = engine.store.reviews()
    assert (item.choice, item.decided_by) == ("approve", "sla-timer")
    [sent] = [json.loads(x) for x in logs[1].read_text().splitlines()]
    assert sent["text"] == "2+3=5"


def test_a_call_waiting_for_approval_cancelled_is_never_run(
        engine_factory: Any, logs: tuple[Path, Path]) -> None:
    engine = engine_factory(llm=Scripted.from_replies(ASK))
    iid = _to_review(engine)
    [item] = engine.reviews()
    assert engine.cancel(iid).status == "cancelled"
    with pytest.raises(ReviewRefused, match="closed undecided by fsm: instance cancelled"):
        engine.decide(item, "approve", by="ann")  # the cancel closed it (issue 36)
    assert [r["tool"] for r in _ran(logs[0])] == ["add"]
    assert not logs[1].exists()


def test_a_fork_of_a_call_waiting_for_approval_waits_on_its_own_item(
        engine_factory: Any, logs: tuple[Path, Path]) -> None:
    """Issue 36 item 1: ``fsm fork ID --from-seq`` at the ask row of an agent waiting for
    approval waited on no item: nothing could end the wait.  (``--from-state research``
    starts before the visit's first turn: tests/runtime/kinds/test_fork.py.)"""
    from fsm_engine.runtime import invariants
    engine = engine_factory(llm=Scripted.from_replies(ASK))
    iid = _to_review(engine)
    [item] = engine.reviews()
    asked = [h.seq for h in engine.store.history(iid) if h.detail.get("agent") == "ask"]
    fid = engine.fork(iid, from_seq=asked[-1])
    assert engine.store.get(fid).forked_at_seq == asked[-1]
    rec = asyncio.run(engine.run(fid))
    assert (rec.status, rec.state, rec.owner) == ("waiting", "research", None)
    [mine] = engine.reviews(instance_id=fid)
    assert mine.id != item.id and mine.show == item.show
    rows = engine.store.history(fid)  # the copied ask row, no second one
    assert [h.seq for h in rows if h.detail.get("agent") == "ask"] == asked[-1:]
    assert engine.store.check() == [] and invariants.check(engine.store) == []  # fsm check
    assert engine.decide(mine, "approve", by="ann").status == "running"
    done = asyncio.run(engine.run(fid))
    assert (done.state, done.context["answer"]) == ("answered", "reported")
    [sent] = [json.loads(x) for x in logs[1].read_text().splitlines()]
    assert sent["key"].startswith(f"{iid}>{fid}:research:1:")  # the fork's own delivery
    assert engine.review(item.id).status == "open"  # the original waits on its own
    assert engine.store.get(iid).status == "waiting"
