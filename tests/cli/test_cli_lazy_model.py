"""``fsm resume``, ``fsm step`` and ``fsm worker`` build a model only when an instance they
run may call one (issue 36: ``CompiledMachine.model_use``, as ``fsm run`` decides): a
machine whose actions take only ``ctx`` runs with no model set up at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from background_worker import until
from cli import run_main
from conftest import ROOT

import fsm_engine.llm.select
from fsm_engine import SqliteStore
from fsm_engine.errors import ClientError

PLAIN = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    n: int = 0

def count(ctx):
    return {"n": ctx.n + 1}

machine = Machine(name="plain", context=C, initial="count",
                  states=[State("count", action=count), State("done", final=True)],
                  transitions=[Transition("ok", "count", "done")])
'''

ASKS = PLAIN.replace("def count(ctx):\n    return",
                     "async def count(ctx, step):\n"
                     "    await step.llm.complete([{'role': 'user', 'content': 'hi'}])\n"
                     "    return").replace('"plain"', '"asks"')

BUILT: list[str] = []


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model spec fails to set up (as the embedded one does without its extra);
    ``BUILT`` records each one asked for."""
    def refuse(spec: str, **_: object) -> None:
        BUILT.append(spec)
        raise ClientError("the local extra is not installed")
    BUILT.clear()
    monkeypatch.setattr(fsm_engine.llm.select, "provider_from_spec", refuse)


@pytest.fixture(autouse=True)
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine modules written here may be imported for the instances naming them."""
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(tmp_path))


def _queued(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str = PLAIN
            ) -> tuple[str, str]:
    """A database holding one instance of ``text``'s machine, enqueued, never run."""
    module, db, data = tmp_path / "machine.py", str(tmp_path / "x.db"), tmp_path / "in.json"
    module.write_text(text)
    data.write_text('{"n": 1}')
    code, out, err = run_main(["start", str(module), "--input", str(data), "--db", db],
                              capsys)
    assert code == 0, err
    return db, out.split()[-1]


def test_resume_runs_a_ctx_only_machine_building_no_model(tmp_path, capsys, no_model) -> None:
    db, iid = _queued(tmp_path, capsys)
    code, out, err = run_main(["resume", "--db", db, "--json", "-q"], capsys)
    assert code == 0, err
    [rec] = json.loads(out)
    assert (rec["id"], rec["status"], rec["context"]["n"]) == (iid, "completed", 2)
    assert BUILT == []


def test_resume_says_which_model_once_an_instance_needs_one(tmp_path, capsys,
                                                            no_model) -> None:
    db, _ = _queued(tmp_path, capsys, ASKS)
    code, out, err = run_main(["resume", "--db", db, "--json"], capsys)
    assert code == 1, err  # the state calling the missing model fails, naming why
    [rec] = json.loads(out)
    assert rec["status"] == "failed" and "the local extra is not installed" in rec["last_error"]
    assert BUILT and "llm: " in err and "unavailable: the local extra is not installed" in err


def test_step_of_a_ctx_only_machine_builds_no_model(tmp_path, capsys, no_model) -> None:
    db, iid = _queued(tmp_path, capsys)
    code, out, err = run_main(["step", iid, "--db", db, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["state"] == "done" and BUILT == []


def test_a_worker_serving_ctx_only_machines_sets_up_no_model(tmp_path, capsys) -> None:
    """A worker whose ``--llm`` cannot be set up (a script that does not exist) runs a
    ctx-only machine's instance to the end: it never built that model."""
    db, iid = _queued(tmp_path, capsys)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("FSM_LLM", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fsm_engine.cli import main; main()", "worker", "--db", db,
         "--llm", f"scripted:{tmp_path / 'absent.jsonl'}", "--poll", "0.05"],
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        store = SqliteStore(db)
        until(lambda: store.get(iid).status == "completed" or proc.poll() is not None,
              "the instance to complete")
        store.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "(1 completed)" in err and "cannot read script" not in err
