"""Replay of an unchanged machine whose guard reads the token budgets (``RunInfo``) is
identical, on both backends, in process and through ``fsm replay`` (exit 0): the driver
and replay build the guards' run information with one builder (``step.run_info``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from budget_guard_machine import machine, retried

from fsm_engine.llm import Scripted
from fsm_engine.runtime.compiled import compile_machine
from fsm_engine.runtime.kinds.replay import replay

REPLY = {"text": "yes", "prompt_tokens": 50, "completion_tokens": 20}
MODULE = str(Path(__file__).resolve().parents[2] / "helpers" / "budget_guard_machine.py")


def _ran(engine_factory):
    engine = engine_factory(llm=Scripted.from_replies([REPLY]))
    iid = engine.start(machine, {})
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.tokens_used) == ("rich", 70)  # the guard saw both budgets
    return engine, rec


def test_replay_of_a_budget_guard_is_identical(engine_factory) -> None:
    engine, rec = _ran(engine_factory)
    history = engine.store.history(rec.id)
    report = replay(compile_machine(machine), rec, history)
    assert report.identical, report.as_json()
    assert report.guards == [] and report.steps == len(history)


def test_cli_replay_of_a_budget_guard_exits_0(engine_factory, store_url: str) -> None:
    engine, rec = _ran(engine_factory)
    engine.close()
    done = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "replay", rec.id, MODULE,
                           "--db", store_url, "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["identical"] is True


def test_replay_counts_a_failed_attempts_tokens_like_the_driver(engine_factory,
                                                                store_url: str) -> None:
    """A state without a budget of its own: its guard reads the visit's tokens (a failed
    attempt's included) and the instance's; replay, given the attempts, agrees."""
    failed = {"text": "", "error": "http500", "prompt_tokens": 30, "completion_tokens": 0}
    engine = engine_factory(llm=Scripted.from_replies([failed, REPLY]))
    iid = engine.start(retried, {})
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.tokens_used) == ("rich", 100), rec.last_error
    report = replay(compile_machine(retried), rec, engine.store.history(iid),
                    engine.store.attempts(iid))
    assert report.identical, report.as_json()
    engine.close()
    done = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "replay", iid,
                           MODULE + ":retried", "--db", store_url], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_exceptions_carry_declared_fields(engine_factory) -> None:
    """``InvalidInput.index`` names the bad input of a batch start (none started)."""
    from fsm_engine.errors import ActionError, InvalidInput
    engine = engine_factory()
    try:
        engine.start_many(machine, [{}, {"answer": ["not", "a", "str"]}, {}])
    except InvalidInput as exc:
        assert exc.index == 1
    else:
        raise AssertionError("start_many accepted an input its model refuses")
    assert engine.store.list() == []
    assert InvalidInput("x").index is None and ActionError("x").guards == []


def test_an_agent_guard_counts_every_turn_and_the_failed_one_in_replay(
        engine_factory) -> None:
    """Issue 36 item 2: an agent state's guard reads the visit's tokens (its journaled
    turns and a failed turn's) and the instance's; replay, given the attempts, agrees."""
    from agent_machine import budget_guarded as agent
    from agent_replies import calls, final
    engine = engine_factory(llm=Scripted.from_replies([
        calls(("add", {"a": 1, "b": 2}), tokens=200),
        {"text": "", "error": "http500", "prompt_tokens": 1000}, final("3", tokens=200)]))
    iid = engine.start(agent, {"question": "1 + 2?"})
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.tokens_used) == ("answered", 1800), rec.last_error
    report = replay(compile_machine(agent), rec, engine.store.history(iid),
                    engine.store.attempts(iid))
    assert report.identical, report.as_json()
