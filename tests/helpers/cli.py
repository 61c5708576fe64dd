"""What the command-line tests share: the reference machines' paths, the ``fsm`` entry
point as a subprocess command, a scripted verdict line, a broken machine module, and
``run_main`` (``fsm_engine.cli.main`` in-process: exit code, stdout, stderr)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import MACHINES, license_files

from fsm_engine import SqliteStore
from fsm_engine.store import InstanceRecord

MODERATION = str(MACHINES / "moderation.py")
ROUTER = str(MACHINES / "router.py")
ENTRY = [sys.executable, "-c", "from fsm_engine.cli import entry; entry()"]
VERDICT_LINE = json.dumps({"text": json.dumps({"decision": "approve", "categories": [],
                                               "summary": "ok"}),
                           "prompt_tokens": 10, "completion_tokens": 5})

BROKEN_MODULE = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    n: int = 0

machine = Machine(name="broken", context=C, initial="a",
                  states=[State("a"), State("island"), State("z", final=True)],
                  transitions=[Transition("go", "a", "z"), Transition("leap", "a", "void")])
'''


def inputs(n: int = 2) -> list[str]:
    files = license_files(n)
    if len(files) < n:
        pytest.skip("needs /usr/share/common-licenses")
    return files


def write_script(path: Path, *lines: str) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def finished_instance(db: str) -> str:
    """A database holding one completed instance; returns its id."""
    store = SqliteStore(db)
    store.create(InstanceRecord(
        id="finished1", machine="moderation", module=MODERATION, fingerprint="x",
        state="done", status="completed", context={"path": "/x"}, input={"path": "/x"},
        max_transitions=30, token_budget=None, created_at=1.0, updated_at=2.0))
    store.close()
    return "finished1"


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Call ``fsm_engine.cli.main`` in-process with ``argv``; return (code, stdout, stderr)."""
    from fsm_engine.cli import main
    old_argv, old_hook = sys.argv, sys.excepthook  # typer installs its own excepthook
    sys.argv = ["fsm", *argv]
    try:
        with pytest.raises(SystemExit) as info:
            main()
    finally:
        sys.argv, sys.excepthook = old_argv, old_hook
    captured = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), captured.out, captured.err
