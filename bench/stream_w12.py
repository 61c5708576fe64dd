"""Streaming a step nobody watches, on the W1/W2 benches (issue 22).

    python bench/stream_w12.py [--n1 300] [--n2 2000] [--repeat 5] [--pieces 1,30]

The W1/W2 machine (``bench.common``: 7 states, 6 transitions, each one committed) with its
``s2`` (``INFER``: where W2 stands a model call in with a 0.2 s sleep) making a real call
to the scripted provider: ``step.llm.complete`` in one variant, ``step.llm.stream(...)
.text()`` in the other, nobody subscribed; every other state's action is W1's ``async def``
bump.  W1: ``--n1`` instances one after another, the reply at once, SQLite
``synchronous=NORMAL`` and ``FULL``; W2: ``--n2`` instances all in flight, the reply after
0.2 s (``delay_s``), ``FULL``.  The reply is 120 characters in one piece or in 30 pieces.

Each run is a fresh child process (5 untimed instances first, as ``bench/run.py`` warms
up), the variants interleaved; it prints the process CPU (threads included) per
transition, the medians of ``--repeat`` runs and the ratio stream / complete.  Timings on
a shared machine vary; read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import INFER, TRANSITIONS  # noqa: E402
from bench.peers.fsm import Counter, abump, linear  # noqa: E402
from fsm_engine import Engine, SqliteStore, Step  # noqa: E402
from fsm_engine.llm.scripted import Scripted  # noqa: E402

MSG = [{"role": "user", "content": "go"}]
#: (workload, synchronous, the model's delay in seconds)
CASES = (("W1", "NORMAL", 0.0), ("W1", "FULL", 0.0), ("W2", "FULL", 0.2))
WARMUP = 5


async def ask(ctx: Counter, step: Step) -> dict[str, int]:
    """``INFER`` calling the model with ``complete``."""
    await step.llm.complete(MSG, max_tokens=64)
    return {"n": ctx.n + 1}


async def ask_streamed(ctx: Counter, step: Step) -> dict[str, int]:
    """``INFER`` calling the model with ``stream(...).text()``: nobody watches."""
    await step.llm.stream(MSG, max_tokens=64).text()
    return {"n": ctx.n + 1}


def reply(pieces: int, delay: float) -> dict[str, Any]:
    """The scripted reply: 120 characters in ``pieces`` pieces, after ``delay`` seconds."""
    line: dict[str, Any] = {"prompt_tokens": 5, "completion_tokens": 30, "delay_s": delay}
    if pieces == 1:
        line["text"] = "x" * 120
    else:
        line["chunks"] = ["x" * (120 // pieces)] * pieces
    return line


async def run(engine: Engine, machine: Any, workload: str, n: int) -> None:
    if workload == "W1":
        for _ in range(n):
            rec = await engine.run(engine.start(machine, None))
            assert rec.status == "completed", rec
    else:
        recs = await engine.run_many(engine.start_many(machine, [None] * n))
        assert all(r.status == "completed" for r in recs)


def child(workload: str, synchronous: str, delay: float, pieces: int, variant: str,
          n: int, path: str) -> float:
    """CPU seconds per transition of ``n`` instances in this process."""
    action = ask_streamed if variant == "stream" else ask
    machine = linear(f"bench_stream_{variant}", {INFER: action}, abump)
    engine = Engine(SqliteStore(path, synchronous=synchronous),
                    llm=Scripted.from_replies([reply(pieces, delay)]))

    async def main() -> float:
        await run(engine, machine, workload, WARMUP)
        start = time.process_time()
        await run(engine, machine, workload, n)
        spent = time.process_time() - start
        await engine.aclose()
        return spent / (n * TRANSITIONS)
    return asyncio.run(main())


def spawn(args: list[str]) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n1", type=int, default=300, help="W1 instances per run")
    ap.add_argument("--n2", type=int, default=2000, help="W2 instances per run")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each variant")
    ap.add_argument("--pieces", default="1,30", help="comma-separated pieces per reply")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        w, sync, delay, pieces, variant, n, path = a.child
        cpu = child(w, sync, float(delay), int(pieces), variant, int(n), path)
        print(json.dumps({"cpu": cpu}))
        return
    tmp = tempfile.mkdtemp(prefix="fsm-stream-w12-")
    for pieces in (int(p) for p in a.pieces.split(",")):
        for workload, sync, delay in CASES:
            n = a.n1 if workload == "W1" else a.n2
            runs: dict[str, list[float]] = {"plain": [], "stream": []}
            for r in range(a.repeat):
                for variant in runs:  # interleaved: the machine's load hits both alike
                    path = os.path.join(tmp, f"{workload}-{sync}-{pieces}-{variant}-{r}.db")
                    runs[variant].append(spawn([workload, sync, str(delay), str(pieces),
                                                variant, str(n), path]))
            p, s = statistics.median(runs["plain"]), statistics.median(runs["stream"])
            print(f"{workload} {sync:6s} {pieces:2d} piece(s): complete {1e6 * p:.1f} µs CPU/"
                  f"transition, stream {1e6 * s:.1f} (medians of {a.repeat}): ratio "
                  f"{s / p:.3f}", flush=True)


if __name__ == "__main__":
    main()
