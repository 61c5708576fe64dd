"""JSON nested deeper than the 100-level cap from the command line (issue 36, item 11):
``fsm send`` and ``fsm review decide`` given a 15 KB update 5,000 deep (``--set`` or a
file) answer one line and exit 2, with nothing written; real processes, a SQLite file."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from fsm_engine import Engine, load_machine
from fsm_engine.store import open_store

FSM = [sys.executable, "-m", "fsm_engine.cli"]
DEEP = "[" * 5000 + "]" * 5000  # 10 KB; as a --set value or in an object: ~15 KB


def _fsm(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FSM_DB": db, "PYTHONPATH": str(ROOT), "FSM_MACHINES_ROOT": str(ROOT)}
    return subprocess.run([*FSM, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _one_line(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("fsm: error: ") and done.stderr.count("\n") == 1, \
        done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "nests deeper than 100" in done.stderr


def _waiting(db: str, module: str, data: dict[str, str]) -> str:
    machine, _ = load_machine(str(ROOT / module))
    engine = Engine(db, llm=None)
    try:
        iid = engine.start(machine, data)
        asyncio.run(engine.run(iid))
        return iid
    finally:
        engine.close()


def test_send_with_a_deep_update_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    iid = _waiting(db, "tests/helpers/console_machine.py:inbox", {})
    deep = tmp_path / "deep.json"
    deep.write_text('{"note": ' + DEEP + "}")
    _one_line(_fsm(db, "send", iid, "release", "--set", "note=" + DEEP))
    _one_line(_fsm(db, "send", iid, "release", "--json-file", str(deep)))
    store = open_store(db)
    try:
        assert store.get(iid).status == "waiting" and store.history(iid) == []
    finally:
        store.close()


def test_review_decide_with_a_deep_edit_is_one_line_and_decides_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    iid = _waiting(db, "tests/helpers/review_machine.py", {"text": "hello"})
    store = open_store(db)
    try:
        [item] = [i for i in store.reviews() if i.instance_id == iid]
    finally:
        store.close()
    deep = tmp_path / "deep.json"
    deep.write_text('{"label": ' + DEEP + "}")
    _one_line(_fsm(db, "review", "decide", item.id, "approve", "--set", "label=" + DEEP))
    _one_line(_fsm(db, "review", "decide", item.id, "approve", "--edit", str(deep)))
    store = open_store(db)
    try:
        assert [i.status for i in store.reviews() if i.id == item.id] == ["open"]
        assert store.get(iid).status == "waiting"
    finally:
        store.close()
