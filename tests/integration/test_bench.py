"""The benchmark harness still runs end to end (a smoke run: nothing here is timed).

Only fsm_engine and the raw-SQLite floor take part (the other peers are optional
installs, ``bench/requirements.txt``); the numbers themselves live in
``bench/RESULTS.md`` and are never asserted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_quick_run_writes_a_report_with_both_fsm_engine_variants(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--quick", "--only", "W1,W2,W3", "--peers",
         "fsm_engine,floor", "--reps", "1", "--n1", "3", "--n2", "20", "--n2-big", "40",
         "--n3", "60", "--workdir", str(tmp_path / "work"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    for heading in ("## Targets", "## W1 durable step overhead, synchronous=FULL",
                    "## W2 concurrency", "## W3 recovery after SIGKILL"):
        assert heading in text
    w1 = text.split("## W1 durable step overhead, synchronous=FULL")[1].split("##")[0]
    cells = {r.split(" | ")[0].lstrip("| "): r.split(" | ")[1] for r in w1.splitlines()
             if r.startswith("| ")}
    for name in ("fsm_engine", "fsm_engine (def actions)", "fsm_engine (def, inline)",
                 "floor (raw SQLite)"):
        assert float(cells[name].replace(",", "")) > 0, name  # measured, not n/a
    assert "| W3 zero completed steps executed twice | 0 | met |" in text
    # CPU µs and (with strace installed) fsyncs per transition beside the wall time
    row = next(r for r in w1.splitlines() if r.startswith("| floor (raw SQLite) |")).split(" | ")
    assert float(row[3].replace(",", "")) > 0 and row[4] == "1.00×"
    if shutil.which("strace"):
        assert float(row[5]) > 0.5  # FULL: about one fsync per committed transition
    sized = text.split("## W1 at three context sizes")[1].split("##")[0]
    assert "100,000 B doc" in sized and "| floor (raw SQLite) | " in sized
    assert "## W2 with 40 instances in flight" in text
