"""A smoke run of bench/viewer.py on a small database: every query and page it times works
(nothing is timed here)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("starlette")


def test_viewer_bench_runs_on_a_small_database(tmp_path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "viewer.py"), "--n", "300",
                           "--reps", "1", "--db", str(tmp_path / "v.db")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "300 instances" in proc.stdout
    assert proc.stdout.count("| page /") == 7 and "machine_stats" in proc.stdout
