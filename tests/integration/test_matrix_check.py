"""The matrix's checker finds what it is there to find: each invariant broken on purpose
in a real store's family (a fan-out of two children, each delivering once); the timer
kinds' own check, on an initial state's armed row."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import matrix_check
import pytest
from matrix_harness import Lab
from matrix_kinds import fired_once, ref
from tampered_store import Tampered

from fsm_engine import Engine
from fsm_engine.store import open_store
from fsm_engine.store.crash import CrashPoint


@pytest.fixture
def family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Lab, Engine]]:
    lab = Lab(str(tmp_path / "fsm.db"), tmp_path)
    for key in ("MATRIX_LOG", "MATRIX_SINK", "FSM_MACHINES_ROOT"):
        monkeypatch.setenv(key, lab.env[key])
    engine = lab.engine()
    iid = engine.start(ref("fan"), {"items": ["a", "b"]})
    asyncio.run(engine.run(iid))
    yield lab, engine
    engine.close()


def found(lab: Lab, engine: Engine, store: Any = None, runs: Any = None,
          sent: Any = None) -> list[str]:
    return matrix_check.check(store or engine.store,
                              lab.executions() if runs is None else runs,
                              lab.deliveries() if sent is None else sent,
                              definition=engine.definition)


def test_a_clean_family_holds(family: tuple[Lab, Engine]) -> None:
    lab, engine = family
    assert len(lab.executions()) == 2 + 2 * 2 and len(lab.deliveries()) == 2
    assert found(lab, engine) == []


def test_a_step_run_after_its_commit(family: tuple[Lab, Engine]) -> None:
    lab, engine = family
    runs = lab.executions()
    late = {**runs[0], "at": runs[-1]["at"] + 60}
    assert any("after its last commit" in p for p in found(lab, engine, runs=[*runs, late]))


def test_a_step_committed_without_a_run(family: tuple[Lab, Engine]) -> None:
    lab, engine = family
    assert any("without a run" in p for p in found(lab, engine, runs=lab.executions()[1:]))


def test_an_item_under_two_keys_and_a_key_twice(family: tuple[Lab, Engine]) -> None:
    lab, engine = family
    sent = lab.deliveries()
    problems = found(lab, engine, sent=[*sent, {**sent[0], "key": "x:notify:1"}, sent[1]])
    assert any("under 2 keys" in p for p in problems)
    assert any("delivered 2 times" in p for p in problems)


def test_a_duplicate_child_and_a_parent_that_never_joined(family: tuple[Lab, Engine]) -> None:
    lab, engine = family
    store = Tampered(engine.store)
    parent = next(r for r in engine.store.list() if r.parent_id is None)
    child = next(r for r in engine.store.list() if r.parent_id)
    store.extra = [replace(child, id=child.id + "x")]
    store.rows[parent.id] = [h for h in engine.store.history(parent.id) if h.kind != "join"]
    problems = found(lab, engine, store=store)
    assert any("2 children for item/branch" in p for p in problems)
    assert any("children all final, 0 join row(s)" in p for p in problems)


def test_a_history_that_does_not_replay(family: tuple[Lab, Engine]) -> None:
    lab, engine = family
    store = Tampered(engine.store)
    parent = next(r for r in engine.store.list() if r.parent_id is None)
    rows = engine.store.history(parent.id)
    store.rows[parent.id] = [replace(rows[0], delta={**rows[0].delta, "items": ["z"]}), *rows[1:]]
    assert any("the deltas replay to" in p for p in found(lab, engine, store=store))


def test_a_timer_fired_twice_early_or_armed_only_by_the_original(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer kinds' check (``matrix_kinds.fired_once``) finds a second fire, a fire
    before the due time its row armed, and a fork whose timer only its original armed."""
    lab = Lab(str(tmp_path / "fsm.db"), tmp_path)
    for key in ("MATRIX_LOG", "MATRIX_SINK", "FSM_MACHINES_ROOT"):
        monkeypatch.setenv(key, lab.env[key])
    engine = lab.engine()
    iid = engine.start(ref("timed_first"), {"item": "t"})
    asyncio.run(engine.run(iid))
    rec, [armed] = engine.store.get(iid), engine.store.history(iid)
    engine.close()
    due = armed.detail["timers"]["late"]
    fire = replace(armed, seq=2, kind="timer", at=due + 0.1, detail={"timer": {"due": due}})
    assert fired_once(rec, [armed, fire], 1.0) == ([], due)
    assert "fired by [2, 3]" in fired_once(rec, [armed, fire, replace(fire, seq=3)], 1.0)[0][0]
    early = replace(fire, at=due - 0.5, detail={"timer": {"due": due - 1}})
    assert len(fired_once(rec, [armed, early], 1.0)[0]) == 2  # another due, and before it
    fork = replace(rec, forked_from="orig", forked_at_seq=1)  # its row 1 the original's
    assert "expected one armed row" in fired_once(fork, [armed, fire], 1.0)[0][0]


@pytest.mark.parametrize("spec", ["commit", "commit:during:1", "commit:before:0",
                                  "save:before:1", "commit:after:1:join:hup"])
def test_a_malformed_crash_point_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="FSM_CRASH_AT"):
        CrashPoint.parse(spec)


def test_a_crash_point_counts_only_matching_calls() -> None:
    point = CrashPoint.parse("commit:after:2:join:stop")
    assert (point.when, point.label) == ("after", "join")
    assert [point.hit(labels) for labels in ({"transition"}, {"join"}, {"transition"},
                                             {"join", "wake"}, {"join"})] == [
        False, False, False, True, False]


def test_unarmed_the_store_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.delenv("FSM_CRASH_AT", raising=False)
    store = open_store(str(tmp_path / "a.db"))
    assert "commit" not in vars(store)
    store.close()
    monkeypatch.setenv("FSM_CRASH_AT", "commit:before:5:join")
    store = open_store(str(tmp_path / "b.db"))
    assert "commit" in vars(store)  # wrapped on the instance; the class is untouched
    store.close()
