"""The collector's tuning (``fsm_engine.collector.tune``) against CPython's defaults, W2.

    python bench/collector.py [--n 10000] [--pairs 3] [--gen0 10000]

Each side runs in its own child process (``bench.peers.fsm.BenchAsyncActions``: W2,
``--n`` instances in flight, ``s2`` sleeping 0.2 s, ``synchronous=FULL``), the two sides
alternating ``--pairs`` times so drifts in the machine's load fall on both; each child
prints its CPU seconds (user + system, ``resource.getrusage``) for the measured run after a
warm-up, and its peak RSS.  Prints each pair and the median ratio tuned/default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(tuned: bool, n: int, gen0: int) -> None:
    """One side: a warm-up, ``tune`` or not, then ``n`` instances in flight; prints JSON."""
    import asyncio
    import resource

    sys.path.insert(0, str(ROOT))
    from bench.common import peak_rss_mib, reset_peak_rss
    from bench.peers import fsm as peer
    from fsm_engine import collector

    async def main() -> dict[str, float]:
        bench = peer.BenchAsyncActions(os.path.join(tempfile.mkdtemp(), "b.db"), "FULL", 0.2)
        await bench.open("W2")
        await bench.concurrent(5)
        if tuned:
            collector.tune((gen0, 10, 10))
        reset_peak_rss()
        before = resource.getrusage(resource.RUSAGE_SELF)
        await bench.concurrent(n)
        after = resource.getrusage(resource.RUSAGE_SELF)
        await bench.close()
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"cpu_s": cpu, "rss_mib": peak_rss_mib()}
    print(json.dumps(asyncio.run(main())))


def run_side(tuned: bool, n: int, gen0: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", "tuned" if tuned else "default",
                          "--n", str(n), "--gen0", str(gen0)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--gen0", type=int, default=10_000)
    ap.add_argument("--child", choices=("tuned", "default"))
    args = ap.parse_args()
    if args.child:
        child(args.child == "tuned", args.n, args.gen0)
        return
    cpu, rss = [], []
    for i in range(args.pairs):
        d, t = run_side(False, args.n, args.gen0), run_side(True, args.n, args.gen0)
        cpu.append(t["cpu_s"] / d["cpu_s"])
        rss.append(t["rss_mib"] / d["rss_mib"])
        print(f"pair {i + 1}: CPU default {d['cpu_s']:.2f} s, tuned {t['cpu_s']:.2f} s; "
              f"peak RSS default {d['rss_mib']:.0f} MiB, tuned {t['rss_mib']:.0f} MiB", flush=True)
    print(f"W2 n={args.n} gen0={args.gen0}: CPU tuned/default {statistics.median(cpu):.3f}, "
          f"peak RSS tuned/default {statistics.median(rss):.3f} (medians of {args.pairs} pairs)")


if __name__ == "__main__":
    main()
