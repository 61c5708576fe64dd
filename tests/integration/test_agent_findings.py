"""Findings of the intersection matrix's agent cells (``tests/integration/test_matrix.py``, kinds
``agent-call`` and ``agent-approval``), each a focused test written before its fix.

A1 (``agent-call-stop-*``, 17 of 110 full cells): a worker SIGSTOPped while its loop had
dispatched another instance's tool call (its thread queued, or awaiting the side effect's
outbox row) and taken over meanwhile ran the tool when let go on (SIGCONT), after the new
owner had journaled that very call: a plain tool ran twice, a side effect reached the
receiver twice under one key with one outbox attempt. Plain actions had this fixed as the
matrix's M3 (``runtime/invoke._fenced``); a tool call now checks the lease where it starts
(in its thread, or before its coroutine), after its outbox row is counted, and does not run
on an outbox row already ``done``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import agent_machine
import pytest
from agent_replies import calls

from fsm_engine.errors import StaleWrite
from fsm_engine.llm import Scripted
from fsm_engine.store.records import TOOL


@pytest.mark.parametrize(("tool", "args"), [("add", {"a": 2, "b": 3}), ("echo", {"text": "hi"}),
                                            ("send_report", {"text": "r"})],
                         ids=["thread", "coroutine", "side-effect"])
def test_a_tool_call_dispatched_before_a_stall_does_not_start_after_it(
        engine_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str,
        args: dict[str, Any]) -> None:
    """Finding A1: the lease, current at the step's checks, is lost by the time the tool
    starts (a SIGSTOP between them, and a takeover): the tool does not run, the step ends
    in ``StaleWrite`` and nothing of the call is journaled."""
    log = tmp_path / "tools.jsonl"
    monkeypatch.setenv("AGENT_TOOL_LOG", str(log))
    monkeypatch.setenv("AGENT_SINK", str(tmp_path / "sink.jsonl"))
    engine = engine_factory(llm=Scripted.from_replies([calls((tool, args))]),
                            lease_seconds=1.0)
    iid = engine.start(agent_machine.machine, {"question": "q"})
    asyncio.run(engine.step(iid))  # the model's turn, journaled
    answers = iter([True, True])  # current at the step's two checks; lost at the tool's start
    engine.driver.lease_current = lambda owner: next(answers, False)
    with pytest.raises(StaleWrite, match="lease"):
        asyncio.run(engine.step(iid))
    assert not log.exists() or log.read_text() == ""
    rows = [r.detail["agent"] for r in engine.store.history(iid) if r.kind == TOOL]
    assert rows == ["turn"]
    assert not (tmp_path / "sink.jsonl").exists()


def test_a_side_effect_whose_outbox_row_is_done_does_not_run_again(
        engine_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding A1: the outbox row of the call's key is ``done`` (the new owner delivered
    and journaled it) when a stale step counts its attempt: the tool does not run."""
    sink = tmp_path / "sink.jsonl"
    monkeypatch.setenv("AGENT_SINK", str(sink))
    engine = engine_factory(llm=Scripted.from_replies([calls(("send_report", {"text": "r"}))]))
    iid = engine.start(agent_machine.machine, {"question": "q"})
    asyncio.run(engine.step(iid))  # the model's turn
    stale, journal = engine.driver.kind_state("agent")[iid]  # what a worker stepping it holds
    journal = copy.deepcopy(journal)
    asyncio.run(engine.step(iid))  # the call, delivered and journaled (by "another worker")
    [box] = engine.store.outbox(iid)
    assert box.status == "done"
    engine.driver.kind_state("agent")[iid] = (stale, journal)  # the stalled worker's view
    engine.driver.lease_current = lambda owner: True  # its clock has not seen the stall
    from fsm_engine.runtime.kinds import agent
    cm = engine.definition(stale)
    state = cm.states["research"]
    with pytest.raises(StaleWrite, match="delivered"):
        asyncio.run(agent.step(engine.driver, cm, stale, state, engine.driver.clock()))
    assert [json.loads(x)["key"] for x in sink.read_text().splitlines()] == [box.key]
