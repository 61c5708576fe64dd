"""The reference machine end to end on the real embedded models (llama.cpp).

The default, Qwen2.5-Coder-0.5B-Instruct, follows the instructions: the README's main job
on the 17 license files gets at least 16 verdicts from the model.  Gemma 3 270M
(``local:gemma-3-270m``) is a base-sized model that often ignores the format: whatever it
answers, every instance must end final through the fallback chain, with a complete history
whose token counts add up to the instance's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MACHINES, license_files
from instance_audit import check_instance
from llm_fixtures import gemma_path, qwen_path  # noqa: F401  (fixtures)

from fsm_engine import Engine
from fsm_engine.llm import FaultInjector

pytestmark = [pytest.mark.model, pytest.mark.slow]


def run_three(db_path: str, llm) -> tuple[Engine, list]:
    eng = Engine(db_path, llm=llm, seed=7)
    ids = [eng.start(str(MACHINES / "moderation.py"), {"path": p}) for p in license_files()[:3]]
    return eng, asyncio.run(eng.run_many(ids))


def _serve_children(tag: str) -> list[int]:
    """Pids of running model children (``fsm_engine.llm.serve``) whose environment has
    ``FSM_TEST_TAG=tag`` (so other runs on the machine don't count), zombies excluded."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"fsm_engine.llm.serve" in cmd and f"FSM_TEST_TAG={tag}".encode() in env \
                and state != "Z":
            found.append(int(proc.name))
    return found


def _fsm_run(tmp_path: Path, files: list[str], *extra: str) -> tuple[subprocess.CompletedProcess,
                                                                     str, str]:
    tag = os.urandom(6).hex()
    db = str(tmp_path / "fsm.db")
    ran = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "run",
                          str(MACHINES / "moderation.py"), "--input", *files, "--db", db, *extra],
                         capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "COLUMNS": "160", "FSM_TEST_TAG": tag},
                         cwd=tmp_path)
    return ran, db, tag


@pytest.mark.fast
def test_three_documents_get_verdicts_from_the_default_model(tmp_path, notify_file, qwen_path,  # noqa: F811
                                                             capsys, monkeypatch):
    """The fast lane's real-model smoke: the README's `fsm run` (in this process) on 3
    license files with the default model: every instance completes with a complete
    history, at least 2 verdicts come from the model itself, no model process is left."""
    from cli import run_main
    tag = os.urandom(6).hex()
    monkeypatch.setenv("FSM_TEST_TAG", tag)  # the model's child inherits it
    db = str(tmp_path / "fsm.db")
    code, out, err = run_main(["run", str(MACHINES / "moderation.py"), "--input",
                               *license_files(3), "--db", db], capsys)
    assert code == 0, err[-2000:]
    assert "verdict_source: " in out
    eng = Engine(db)
    try:
        records = eng.store.list()
        assert [r.status for r in records] == ["completed"] * 3
        for rec in records:
            check_instance(eng, rec)
        sources = [r.context["verdict_source"] for r in records]
    finally:
        eng.close()
    assert sum(s in ("model", "constrained") for s in sources) >= 2, sources
    assert len(notify_file.read_text().splitlines()) == 3
    assert _serve_children(tag) == []  # the model's child stopped with the run


def test_readme_main_command_gets_verdicts_from_the_default_model(tmp_path, notify_file,
                                                                  qwen_path):  # noqa: F811
    """The README's `fsm run` on the 17 license files with the default model, as a user runs
    it: every instance completes, at least 16 verdicts come from the model itself
    (``model`` or ``constrained``), no model process is left."""
    files = license_files()
    ran, db, tag = _fsm_run(tmp_path, files)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "verdict_source: " in ran.stdout and "Traceback" not in ran.stderr
    eng = Engine(db)
    records = eng.store.list()
    assert len(records) == len(files) and all(r.status == "completed" for r in records)
    for rec in records:
        check_instance(eng, rec)
    sources = [r.context["verdict_source"] for r in records]
    assert sum(s in ("model", "constrained") for s in sources) >= len(files) - 1, sources
    assert len(notify_file.read_text().splitlines()) == len(files)
    assert _serve_children(tag) == []  # the model's child stopped with the run


def test_gemma_still_works_end_to_end_through_the_fallback_chain(tmp_path, notify_file,
                                                                 gemma_path):  # noqa: F811
    """``--llm local:gemma-3-270m``: the small model rarely follows the format; re-ask,
    constrained decoding and the keyword rule still complete every instance."""
    ran, db, tag = _fsm_run(tmp_path, license_files()[:2], "--llm", "local:gemma-3-270m")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "gemma-3-270m" in ran.stderr  # the header names the model that served the run
    eng = Engine(db)
    records = eng.store.list()
    assert [r.status for r in records] == ["completed"] * 2
    for rec in records:
        check_instance(eng, rec)
        assert rec.context["verdict_source"] in ("model", "constrained", "rules")
    assert _serve_children(tag) == []


def test_moderation_with_faults_on_the_real_model(db_path, notify_file, gemma_path):  # noqa: F811
    from fsm_engine.llm import LocalLlama
    faulty = FaultInjector(LocalLlama(gemma_path), {"http500": 0.2, "http429": 0.1,
                                                    "malformed": 0.2, "truncated": 0.1}, seed=5)
    eng, records = run_three(db_path, faulty)
    for rec in records:
        check_instance(eng, rec)
    assert sum(r.tokens_used for r in records) == faulty.total_tokens
