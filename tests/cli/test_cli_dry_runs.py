"""A dry run writes nothing (issue 36, item 14): ``fsm migrate`` without ``--yes`` and the
bulk commands' dry runs given ``--machines`` (``fsm restart``, ``fsm fork``, ``fsm rerun``)
leave every table's rows as they were — they inserted a ``definitions`` row of the
machine they loaded.  Real processes on a SQLite file, all its tables compared."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT
from migration_machines import V1, V2, write

from fsm_engine import Engine, load_machine

FSM = [sys.executable, "-m", "fsm_engine.cli"]


def _rows(db: str) -> dict[str, list[Any]]:
    """Every table's rows (sorted), read with plain sqlite3."""
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: sorted(map(repr, con.execute(f'SELECT * FROM "{t}"'))) for t in tables}
    finally:
        con.close()


def _fsm(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FSM_MACHINES_ROOT": str(root)}
    return subprocess.run([*FSM, *args], env=env, cwd=root, capture_output=True, text=True,
                          timeout=120)


def test_fsm_migrate_dry_run_writes_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    module = write(tmp_path / "flow.py", V1)
    machine, _ = load_machine(module)
    engine = Engine(db, llm=None)
    try:
        engine.start_many(machine, [{"text": "one two"}, {"text": "three"}], enqueue=True)
    finally:
        engine.close()
    write(tmp_path / "flow.py", V2)
    before = _rows(db)
    dry = _fsm(tmp_path, "migrate", "--db", db)
    assert dry.returncode == 0 and "2 to migrate" in dry.stdout, dry.stderr
    assert _rows(db) == before


def test_bulk_dry_runs_given_machines_write_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    module = write(tmp_path / "flow.py", V1)
    machine, _ = load_machine(module)
    engine = Engine(db, llm=None)
    try:
        ids = engine.start_many(machine, [{"text": "one"}, {"text": "two"}], enqueue=True)
        for iid in ids:
            engine.cancel(iid, operator="t")
    finally:
        engine.close()
    con = sqlite3.connect(db)
    with con:
        con.execute("DELETE FROM definitions")  # (stored before this code version)
    con.close()
    before = _rows(db)
    for args in (["restart"], ["fork"], ["rerun", "--state", "start"]):
        dry = _fsm(tmp_path, *args, "--machine", "flow", "--status", "cancelled", "--db", db,
                   "--machines", module)
        assert dry.returncode == 0 and "2 instance(s) match" in dry.stdout, (args, dry.stderr)
        assert _rows(db) == before, args
