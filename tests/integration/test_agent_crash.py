"""SIGKILL at every point of a 3-turn, 4-call agent loop (issue 23), then resume.

A real runner process (scripted model, real SQLite file) is killed before and after each
journal commit, inside each tool, between a side effect's outbox row and its result, and
before the final transition; a second process resumes it.  After each: the final output
equals an uninterrupted run's; a call journaled before the kill never ran again; the
side-effect tool has one completed delivery under one key; the store's invariants hold.
"""

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

from fsm_engine.runtime.invariants import check
from fsm_engine.store import open_store
from fsm_engine.store.records import TOOL

pytestmark = pytest.mark.slow  # real processes SIGKILLed

HERE = Path(__file__).resolve().parents[1] / "helpers"
ROOT = HERE.parents[1]

RUNNER = '''
import asyncio, json, sys
from fsm_engine import Engine
from fsm_engine.llm import Scripted
cfg = json.load(open(sys.argv[1]))
eng = Engine(cfg["db"], llm=Scripted.from_replies(cfg["replies"], model="m"), seed=1)
eng.load(cfg["module"])
if not eng.store.list():
    eng.start(cfg["module"], {"question": "what is 2 + 3?"}, instance_id="a1")
asyncio.run(eng.resume())
eng.close()
'''


#: (name, environment): every place a process can die in the loop.
POINTS: list[tuple[str, dict[str, str]]] = [
    *[(f"before-journal-{n}", {"FSM_CRASH_AT": f"commit:before:{n}:{TOOL}"}) for n in range(1, 7)],
    *[(f"after-journal-{n}", {"FSM_CRASH_AT": f"commit:after:{n}:{TOOL}"}) for n in range(1, 7)],
    *[(f"mid-{tool}", {"AGENT_KILL_IN": tool}) for tool in ("add", "echo", "send_report")],
    ("mid-outbox", {"FSM_CRASH_AT": "outbox_begins:after:1"}),
    ("before-final", {"FSM_CRASH_AT": "commit:before:1:final"}),
]


def _run(tmp: Path, extra: dict[str, str], db: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "cfg.json"
    cfg.write_text(json.dumps({"db": db or str(tmp / "fsm.db"), "replies": KEYED,
                               "module": str(HERE / "agent_machine.py")}))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}",
           "AGENT_TOOL_LOG": str(tmp / "tools.jsonl"), "AGENT_SINK": str(tmp / "sink.jsonl"),
           "AGENT_KILL_IN_DONE": str(tmp / "killed"), **extra}
    return subprocess.run([sys.executable, "-c", RUNNER, str(cfg)], env=env, text=True,
                          capture_output=True, timeout=120)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _key(run: dict[str, Any]) -> str:
    return json.dumps([run["tool"], run["args"]], sort_keys=True)


def _journaled(db: str) -> set[str]:
    """The calls journaled in ``db`` (as ``_key`` s)."""
    store = open_store(db)
    try:
        rows = store.history("a1") if store.list() else []
    finally:
        store.close()
    return {json.dumps([r.detail["tool"], r.detail["arguments"]], sort_keys=True)
            for r in rows if r.kind == TOOL and r.detail.get("agent") == "call"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("whole")
    done = _run(tmp, {})
    assert done.returncode == 0, done.stderr
    store = open_store(str(tmp / "fsm.db"))
    try:
        return store.get("a1").context
    finally:
        store.close()


@pytest.mark.parametrize(("point", "env"), POINTS, ids=[p for p, _ in POINTS])
def test_a_kill_anywhere_in_the_loop_resumes_to_the_same_output(
        tmp_path: Path, point: str, env: dict[str, str], uninterrupted: dict[str, Any]) -> None:
    _kill_and_resume(tmp_path, point, env, str(tmp_path / "fsm.db"), uninterrupted)


#: The kinds of point, once each, on PostgreSQL.
PG_POINTS = [p for p in POINTS if p[0] in ("before-journal-3", "after-journal-4", "mid-echo",
                                           "mid-outbox", "before-final")]


@pytest.mark.parametrize(("point", "env"), PG_POINTS, ids=[p for p, _ in PG_POINTS])
def test_a_kill_in_the_loop_on_postgres_resumes_to_the_same_output(
        tmp_path: Path, point: str, env: dict[str, str], uninterrupted: dict[str, Any],
        pg_cluster: Any) -> None:
    _kill_and_resume(tmp_path, point, env, pg_cluster.database(), uninterrupted)


def _kill_and_resume(tmp_path: Path, point: str, env: dict[str, str], db: str,
                     uninterrupted: dict[str, Any]) -> None:
    killed = _run(tmp_path, env, db)
    assert killed.returncode == -9, (point, killed.returncode, killed.stderr[-2000:])
    before = _journaled(db)
    runs_before = Counter(_key(r) for r in _lines(tmp_path / "tools.jsonl"))
    resumed = _run(tmp_path, {}, db)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    store = open_store(db)
    try:
        rec = store.get("a1")
        assert (rec.status, rec.state) == ("completed", "answered")
        assert rec.context == uninterrupted
        rows = store.history("a1")
        [box] = store.outbox("a1")
        problems = check(store)
    finally:
        store.close()
    assert problems == []
    runs = Counter(_key(r) for r in _lines(tmp_path / "tools.jsonl"))
    assert len(runs) == 4  # every call of the loop ran
    for call in before:  # journaled before the kill: never run again
        assert runs[call] == runs_before[call] == 1, (point, call)
    assert all(n <= 2 for n in runs.values()), runs
    calls = [r for r in rows if r.kind == TOOL and r.detail.get("agent") == "call"]
    assert len(calls) == 4  # each call journaled once
    assert (box.status, box.key) == ("done", "a1:research:1:2:2.2")
    sent = _lines(tmp_path / "sink.jsonl")
    assert {s["key"] for s in sent} == {box.key}
    assert 1 <= len(sent) <= box.attempts  # a delivery repeated only under its one key
