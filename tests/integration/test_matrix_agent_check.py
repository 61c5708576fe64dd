"""The matrix's agent invariants (``matrix_agent``) find what they are there to find: each
broken on purpose in a real store's uninterrupted agent loop (three turns, two calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import matrix_check
import pytest
from matrix_harness import Lab
from matrix_kinds import ref
from tampered_store import Tampered

from fsm_engine import Engine
from fsm_engine.llm import Scripted
from fsm_engine.store.crash import labels


@pytest.fixture
def loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Lab, Engine, str]]:
    lab = Lab(str(tmp_path / "fsm.db"), tmp_path)
    for key in ("MATRIX_LOG", "MATRIX_SINK", "FSM_MACHINES_ROOT"):
        monkeypatch.setenv(key, lab.env[key])
    engine = lab.engine(Scripted(lab.script))
    iid = engine.start(ref("agent_loop"), {"item": "a"})
    asyncio.run(engine.run(iid))
    yield lab, engine, iid
    engine.close()


def found(lab: Lab, engine: Engine, store: object = None, runs: object = None) -> list[str]:
    return matrix_check.check(store or engine.store,
                              lab.executions() if runs is None else runs,  # type: ignore[arg-type]
                              lab.deliveries(), definition=engine.definition)


def test_an_uninterrupted_loop_holds(loop: tuple[Lab, Engine, str]) -> None:
    lab, engine, iid = loop
    assert [(e["tool"], e["call"]) for e in lab.executions()] == [("look", "1.1"),
                                                                 ("report", "2.1")]
    assert [d["key"] for d in lab.deliveries()] == [f"{iid}:research:1:2:2.1"]
    assert engine.store.get(iid).context["answer"] == "reported"
    assert found(lab, engine) == []


def test_a_call_run_twice_without_a_takeover(loop: tuple[Lab, Engine, str]) -> None:
    lab, engine, _ = loop
    runs = lab.executions()
    again = {**runs[0], "at": runs[0]["at"] - 0.001}
    assert any("ran 2 times, 1 allowed" in p
               for p in found(lab, engine, runs=[again, *runs]))


def test_a_call_run_after_it_was_journaled(loop: tuple[Lab, Engine, str]) -> None:
    lab, engine, _ = loop
    runs = lab.executions()
    late = {**runs[0], "at": runs[-1]["at"] + 60}
    assert any("after it was journaled" in p for p in found(lab, engine, runs=[*runs, late]))


def test_a_call_journaled_without_a_run(loop: tuple[Lab, Engine, str]) -> None:
    lab, engine, _ = loop
    assert any("journaled without a run" in p
               for p in found(lab, engine, runs=lab.executions()[1:]))


def test_a_call_journaled_twice_is_not_an_uninterrupted_journal(loop: tuple[Lab, Engine, str]) -> None:
    lab, engine, iid = loop
    store = Tampered(engine.store)
    rows = engine.store.history(iid)
    call = next(r for r in rows if r.detail.get("agent") == "call")
    twice = [*rows[:call.seq], replace(call, seq=call.seq + 1),
             *[replace(r, seq=r.seq + 1) for r in rows[call.seq:]]]
    store.rows[iid] = twice
    problems = found(lab, engine, store=store)
    assert any("call 1.1 of visit 1 journaled 2 times" in p for p in problems)
    assert any("an uninterrupted run's is" in p for p in problems)


def test_an_agent_commit_is_labelled_by_its_journal_row(loop: tuple[Lab, Engine, str]) -> None:
    _, engine, iid = loop
    names = {r.detail.get("agent") for r in engine.store.history(iid) if r.kind == "tool"}
    assert names == {"turn", "call"}
    for row in engine.store.history(iid):
        step = SimpleNamespace(history=[row], create=None, wake=None, outbox_done=None,
                               record=SimpleNamespace(parent_id=None, status="running"))
        want = {f"agent={row.detail['agent']}"} if row.kind == "tool" else set()
        assert {x for x in labels("commit", [[step]]) if x.startswith("agent=")} == want


def test_a_late_run_is_excused_only_in_a_process_taken_over(
        loop: tuple[Lab, Engine, str]) -> None:
    lab, engine, iid = loop
    rows = engine.store.history(iid)
    call = next(r for r in rows if r.detail.get("agent") == "call")
    taken = replace(rows[0], kind="recovery", detail={"recovery": {"from_pid": 4242}})
    store = Tampered(engine.store)
    store.rows[iid] = [*rows[:call.seq - 1], taken, *rows[call.seq - 1:]]
    runs = lab.executions()
    late = {**runs[0], "at": call.at + 1}
    ok = found(lab, engine, store=store, runs=[*runs, {**late, "pid": 4242}])
    assert not any("call 1.1" in p for p in ok), ok
    bad = found(lab, engine, store=store, runs=[*runs, {**late, "pid": 4243}])
    assert any("after it was journaled" in p and "not in a process taken over" in p
               for p in bad)
    twice = found(lab, engine, store=store, runs=[*runs, {**late, "pid": 4242},
                                                   {**late, "pid": 4242}])
    assert any("call 1.1 (look) ran 3 times, 2 allowed" in p for p in twice)
