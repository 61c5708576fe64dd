"""Where fsm_engine spends its time: ``python -m bench.workloads.profile WORKDIR N1 N2``.

Runs W1 (``N1`` instances, FULL and NORMAL) and W2 (``N2`` instances, FULL)
under cProfile and prints, as JSON, per case the wall time, the functions
with the largest self time and the fsm_engine functions with the largest
cumulative time, each as a share of the profiled wall time.  cProfile
roughly doubles the cost of Python calls, so shares of pure-Python code
are overstated relative to time spent in C (SQLite, fsync, epoll).
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import sys
import time
from typing import Any

TOP = 14


def _label(key: tuple[str, int, str]) -> str:
    path, line, func = key
    if path == "~":
        return func
    marker = f"{os.sep}fsm_engine{os.sep}"
    if marker in path:
        path = "fsm_engine/" + path.split(marker, 1)[1]
    else:
        path = os.path.basename(path)
    return f"{path}:{func}"


def summarise(stats: pstats.Stats, wall: float) -> dict[str, Any]:
    """Top self-time functions and top fsm_engine cumulative functions, as shares of ``wall``."""
    rows = stats.stats  # type: ignore[attr-defined]
    by_self = sorted(rows.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP]
    ours = [(k, v) for k, v in rows.items() if f"{os.sep}fsm_engine{os.sep}" in k[0]]
    by_cum = sorted(ours, key=lambda kv: kv[1][3], reverse=True)[:TOP]
    return {
        "wall_s": wall,
        "self": [[_label(k), v[1], v[2] / wall] for k, v in by_self],
        "cumulative": [[_label(k), v[1], v[3] / wall] for k, v in by_cum],
    }


async def _case(workdir: str, workload: str, synchronous: str, n: int) -> dict[str, Any]:
    from ..common import fresh_path
    from ..peers.fsm import Bench
    bench = Bench(fresh_path(workdir, f"profile-{workload}-{synchronous}.db"), synchronous, 0.2)
    await bench.open(workload)
    await (bench.sequential(5) if workload == "W1" else bench.concurrent(5))
    prof = cProfile.Profile()
    started = time.perf_counter()
    prof.enable()
    await (bench.sequential(n) if workload == "W1" else bench.concurrent(n))
    prof.disable()
    wall = time.perf_counter() - started
    await bench.close()
    return summarise(pstats.Stats(prof), wall)


def main(workdir: str, n1: int, n2: int) -> dict[str, Any]:
    cases = {f"W1 {s} ({n1} instances)": ("W1", s, n1) for s in ("FULL", "NORMAL")}
    cases[f"W2 FULL ({n2} instances)"] = ("W2", "FULL", n2)
    return {name: asyncio.run(_case(workdir, *args)) for name, args in cases.items()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
