"""The garbage collector's tuning (issue 39, item 2): a process started as the ``fsm``
command tunes it after start-up; ``main`` hosted by another program leaves it alone, as
``FSM_GC=default`` does.  Each check runs in a child process: a test run's own collector is
not to be frozen."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = (700, 10, 10)  # CPython 3.11's


def _child(code: str, **env: str) -> list[str]:
    """Run ``code`` in a child interpreter; its last stderr line split on '|'."""
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, env={**os.environ, **env})
    return ran.stderr.strip().splitlines()[-1].split("|")


SHOW = ("import atexit, gc, sys\n"
        "atexit.register(lambda: print(f'{gc.get_threshold()}|{gc.get_freeze_count() > 0}', "
        "file=sys.stderr))\n")


def test_tune_freezes_start_up_and_raises_generation_0() -> None:
    assert _child(SHOW + "from fsm_engine import collector; assert collector.tune()") == \
        ["(10000, 10, 10)", "True"]


def test_fsm_gc_default_leaves_the_collector_alone() -> None:
    assert _child(SHOW + "from fsm_engine import collector; assert not collector.tune()",
                  FSM_GC="default") == [str(DEFAULTS), "False"]


MACHINE = """
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class Ctx(BaseModel):
    n: int = 0

def bump(ctx: Ctx) -> dict[str, int]:
    return {"n": ctx.n + 1}

machine = Machine("tick", context=Ctx, initial="init",
                  states=[State("init", action=bump), State("done", final=True)],
                  transitions=[Transition("go", "init", "done")])
"""


def _fsm_run(call: str, tmp_path: Path) -> list[str]:
    """``fsm run`` of a model-less machine through ``fsm_engine.cli.CALL``; asserts it ran."""
    (tmp_path / "tick.py").write_text(MACHINE)
    (tmp_path / "in.json").write_text("{}")
    argv = ["fsm", "run", str(tmp_path / "tick.py"), "-i", str(tmp_path / "in.json"),
            "--db", str(tmp_path / "r.db"), "-q", "--json"]
    shown = _child(SHOW + f"import sys\nsys.argv = {argv!r}\n"
                   f"from fsm_engine.cli import {call}\ntry:\n    {call}()\n"
                   "except SystemExit as e:\n    assert e.code == 0, e.code")
    with sqlite3.connect(tmp_path / "r.db") as db:
        assert db.execute("SELECT status FROM instances").fetchall() == [("completed",)]
    return shown


def test_the_fsm_command_tunes_its_own_process(tmp_path: Path) -> None:
    assert _fsm_run("entry", tmp_path) == ["(10000, 10, 10)", "True"]


def test_main_hosted_by_another_program_leaves_its_collector_alone(tmp_path: Path) -> None:
    assert _fsm_run("main", tmp_path) == [str(DEFAULTS), "False"]
