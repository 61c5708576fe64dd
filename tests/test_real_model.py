"""The reference machine end to end on the real embedded model (Gemma 3 270M via llama.cpp).

Gemma 270M is a base-sized model that often ignores the format: whatever it
answers, every instance must end final, with a complete history whose token
counts add up to the instance's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MACHINES, license_files
from fsm_engine import Engine
from fsm_engine.llm import FaultInjector
from fsm_engine.views import context_after
from llm_fixtures import gemma_path  # noqa: F401  (fixture)

pytestmark = [pytest.mark.model, pytest.mark.slow]


def check_instance(eng: Engine, rec) -> None:
    """Final, gap-free history that replays to the stored context, tokens that add up."""
    assert rec.final and (rec.status == "completed" or rec.reason), (rec.status, rec.reason)
    rows = eng.store.history(rec.id)
    assert [h.seq for h in rows] == list(range(1, rec.seq + 1))
    assert rows[-1].dest == rec.state
    assert context_after(rec, rows)[-1] == rec.context
    billed = sum(h.tokens for h in rows) + sum(a.tokens for a in eng.store.attempts(rec.id))
    assert billed == rec.tokens_used > 0


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


def test_readme_main_command_on_three_license_files(tmp_path, notify_file, gemma_path):  # noqa: F811
    """The README's `fsm run` on the embedded default model, as a user runs it: every
    instance completes, the verdict sources are counted, no model process is left."""
    tag = os.urandom(6).hex()
    db = str(tmp_path / "fsm.db")
    ran = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "run",
                          str(MACHINES / "moderation.py"), "--input", *license_files()[:3],
                          "--db", db], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "COLUMNS": "160", "FSM_TEST_TAG": tag},
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "verdict_source: " in ran.stdout and "Traceback" not in ran.stderr
    eng = Engine(db)
    records = eng.store.list()
    assert len(records) == 3 and all(r.status == "completed" for r in records)
    for rec in records:
        check_instance(eng, rec)
    assert len(notify_file.read_text().splitlines()) == 3
    assert _serve_children(tag) == []  # the model's child stopped with the run


def test_moderation_with_faults_on_the_real_model(db_path, notify_file, gemma_path):  # noqa: F811
    from fsm_engine.llm import LocalLlama
    faulty = FaultInjector(LocalLlama(gemma_path), {"http500": 0.2, "http429": 0.1,
                                                    "malformed": 0.2, "truncated": 0.1}, seed=5)
    eng, records = run_three(db_path, faulty)
    for rec in records:
        check_instance(eng, rec)
    assert sum(r.tokens_used for r in records) == faulty.total_tokens


def test_moderation_on_qwen_gives_model_verdicts(db_path, notify_file):
    """The instruction-following local option: most verdicts come from the model itself."""
    from fsm_engine.llm import LocalLlama
    from fsm_engine.llm.models import qwen_path

    try:
        qwen_path()
    except Exception as exc:  # noqa: BLE001 - only a missing extra skips, outside CI
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the [qwen] extra is not installed: {exc}")
    provider = LocalLlama("qwen2.5-0.5b")
    eng, records = run_three(db_path, provider)
    asyncio.run(provider.aclose())
    for rec in records:
        check_instance(eng, rec)
    sources = [r.context["verdict_source"] for r in records]
    assert [r.status for r in records] == ["completed"] * 3
    assert sources.count("model") >= 2, sources
    assert all(r.context["verdict"]["decision"] in ("approve", "reject", "review") for r in records)
