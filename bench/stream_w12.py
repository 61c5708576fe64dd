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
up), the variants interleaved in pairs; it prints the process CPU (user + system, threads
included, as ``bench/run.py`` counts it) per transition, medians of ``--repeat`` runs, and
the ratio stream / complete: the median of the pairs' ratios (with its quartiles and its
95 % confidence interval, from 6 pairs), for the
process CPU and for the user CPU alone (the system part, mostly the store's writes and
fsyncs, is the same work in both variants and swings most between runs).  Timings on a
shared machine vary; read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
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
        assert all(not isinstance(r, Exception) and r.status == "completed" for r in recs)


def setup(variant: str, synchronous: str, delay: float, pieces: int,
          path: str) -> tuple[Engine, Any]:
    """The engine on a SQLite file at ``path`` and the machine of ``variant`` (``plain``:
    ``complete``; ``stream``: ``stream(...).text()``), the scripted model answering
    ``reply(pieces, delay)``."""
    action = ask_streamed if variant == "stream" else ask
    machine = linear(f"bench_stream_{variant}", {INFER: action}, abump)
    engine = Engine(SqliteStore(path, synchronous=synchronous),
                    llm=Scripted.from_replies([reply(pieces, delay)]))
    return engine, machine


def child(workload: str, synchronous: str, delay: float, pieces: int, variant: str,
          n: int, path: str) -> tuple[float, float]:
    """(process CPU, user CPU) seconds per transition of ``n`` instances in this process."""
    engine, machine = setup(variant, synchronous, delay, pieces, path)

    async def main() -> tuple[float, float]:
        await run(engine, machine, workload, WARMUP)
        start, user = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
        await run(engine, machine, workload, n)
        spent, user = time.process_time() - start, resource.getrusage(resource.RUSAGE_SELF).ru_utime - user
        await engine.aclose()
        return spent / (n * TRANSITIONS), user / (n * TRANSITIONS)
    return asyncio.run(main())


def spawn(args: list[str]) -> tuple[float, float]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got["cpu"]), float(got["user"])


def median_ci(n: int, level: float = 0.95) -> tuple[int, int] | None:
    """The 0-based ranks (lo, hi) of the sorted sample of ``n`` bounding a distribution-free
    ``level`` confidence interval of its median (None: ``n`` too small for one): the
    largest ``k`` with P(Binomial(n, 1/2) < k) <= (1 - level) / 2 gives ranks ``k - 1``
    and ``n - k`` (the sign-test interval: W. J. Conover, *Practical Nonparametric
    Statistics*, 3rd ed., 1999, section 3.2)."""
    tail, k, cdf = (1 - level) / 2, 0, 0.0
    while k < n:
        p = math.comb(n, k) / 2 ** n  # P(X = k)
        if cdf + p > tail:
            break
        cdf += p
        k += 1
    return (k - 1, n - k) if k >= 1 else None


def ratios(plain: list[float], stream: list[float]) -> str:
    """The median of the pairs' ratios stream / plain, its quartiles, and (from 6 pairs)
    the 95 % confidence interval of that median (``median_ci``)."""
    r = sorted(s / p for p, s in zip(plain, stream, strict=True))
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
    ci = median_ci(len(r))
    tail = "" if ci is None else f"; 95 % CI of the median {r[ci[0]]:.3f}–{r[ci[1]]:.3f}"
    return f"{statistics.median(r):.3f} (quartiles {q[0]:.3f}–{q[2]:.3f}{tail})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n1", type=int, default=300, help="W1 instances per run")
    ap.add_argument("--n2", type=int, default=2000, help="W2 instances per run")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each variant")
    ap.add_argument("--pieces", default="1,30", help="comma-separated pieces per reply")
    ap.add_argument("--only", default="W1,W2", help="comma-separated workloads (W1, W2)")
    ap.add_argument("--save", help="append each case's raw CPU figures to this JSON-lines file")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        w, sync, delay, pieces, variant, n, path = a.child
        spent, user_s = child(w, sync, float(delay), int(pieces), variant, int(n), path)
        print(json.dumps({"cpu": spent, "user": user_s}))
        return
    tmp = tempfile.mkdtemp(prefix="fsm-stream-w12-")
    for pieces in (int(p) for p in a.pieces.split(",")):
        for workload, sync, delay in CASES:
            if workload not in a.only.split(","):
                continue
            n = a.n1 if workload == "W1" else a.n2
            runs: dict[str, list[tuple[float, float]]] = {"plain": [], "stream": []}
            for r in range(a.repeat):
                for variant in runs:  # interleaved: the machine's load hits both alike
                    path = os.path.join(tmp, f"{workload}-{sync}-{pieces}-{variant}-{r}.db")
                    runs[variant].append(spawn([workload, sync, str(delay), str(pieces),
                                                variant, str(n), path]))
            cpu = {v: [c for c, _ in got] for v, got in runs.items()}
            user = {v: [u for _, u in got] for v, got in runs.items()}
            if a.save:
                with open(a.save, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"workload": workload, "synchronous": sync,
                                        "pieces": pieces, "cpu": cpu, "user": user}) + "\n")
            print(f"{workload} {sync:6s} {pieces:2d} piece(s), {a.repeat} pairs: complete "
                  f"{1e6 * statistics.median(cpu['plain']):.1f} µs CPU/transition, stream "
                  f"{1e6 * statistics.median(cpu['stream']):.1f}; stream/complete: CPU "
                  f"{ratios(cpu['plain'], cpu['stream'])}, user CPU "
                  f"{ratios(user['plain'], user['stream'])}", flush=True)


if __name__ == "__main__":
    main()
