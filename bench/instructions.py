"""Instructions per durable transition, counted by valgrind (callgrind), two runs side by side.

    python bench/instructions.py trees --base /path/to/other/checkout --base-python /its/venv/bin/python
                                       [--workload W2|W1N|W1F] [--n 1000]
    python bench/instructions.py stream [--n 1000] [--pieces 1] [--workload W2|W1]

CPU time on a shared 2-core VM swings ±10 % between runs of the same code (steal, other jobs,
fsync latency), so a 5 % bar (issue 20: the redesign within 5 % of the code before it; issue
22: a streamed call nobody watches within 5 % of a plain one) cannot be read off a handful of
timings.  Instructions executed hardly swing: this runs the workload under ``valgrind
--tool=callgrind`` (every thread, native code included: SQLite, pydantic-core, the garbage
collector) twice per side, with 0 and with ``--n`` measured instances after the same warm-up,
and divides the difference by the transitions, so start-up and imports cancel out.

- ``trees``: the W1/W2 workload of ``bench.peers.fsm`` (``BenchAsyncActions``, the
  ``fsm_engine`` row of ``bench/run.py``) in this checkout and in ``--base`` (each with its
  own interpreter: an editable install maps ``fsm_engine`` to its own tree), both sides
  running at once so W2's group-commit batches form under the same load.  ``W2``: ``--n``
  instances in flight, ``s2`` sleeping 0.2 s; ``W1N``/``W1F``: one after another,
  ``synchronous=NORMAL``/``FULL``.
- ``stream``: ``bench/stream_w12.py``'s machine, ``s2`` calling the scripted model with
  ``complete`` against ``stream(...).text()`` (``--pieces`` pieces, arriving together);
  ``W2``: ``--n`` instances in flight, the reply after 0.2 s; ``W1``: one instance after
  another, the reply at once (``synchronous=FULL``; no group-commit batches to vary, so
  the count moves ~1 % run to run: the lease heartbeat thread's share grows with the
  run's wall time under valgrind).

Prints one line per side (instructions per transition) and the ratio.  Needs Debian's
``valgrind``; a run takes about two minutes (the workload runs ~50× slower under it).
Each run has ``OPENBLAS_NUM_THREADS=1``: creating a database imports sqlite-utils, which
imports numpy when installed (it comes with llama-cpp-python), whose OpenBLAS worker thread
spins for a while under valgrind and counted on one side more than the other (41k
instructions per instance in one W1 run).  What it does not see: cache misses and memory
stalls (the garbage collector's walks, in W2's 2,000 instances in flight), which CPU time
includes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRANSITIONS = 6  # bench.common: 7 states, 6 transitions per instance
WARMUP = 5


def child_trees(tree: str, workload: str, n: int) -> None:
    """The W1/W2 workload of ``tree``'s ``bench.peers.fsm``: a warm-up, then ``n`` instances."""
    sys.path.insert(0, tree)
    from bench.peers import fsm as peer  # (the tree's own copy)

    async def main() -> None:
        sync = "NORMAL" if workload == "W1N" else "FULL"
        bench = peer.BenchAsyncActions(os.path.join(tempfile.mkdtemp(), "b.db"), sync, 0.2)
        await bench.open("W2" if workload == "W2" else "W1")
        for count in (WARMUP, n):
            if count:
                await (bench.concurrent(count) if workload == "W2" else bench.sequential(count))
        await bench.close()
    asyncio.run(main())


def child_stream(variant: str, pieces: int, n: int, workload: str = "W2") -> None:
    """``bench/stream_w12.py``'s machine, ``variant`` ``plain`` or ``stream``: ``W2`` (the
    reply after 0.2 s, instances in flight) or ``W1`` (the reply at once, one instance after
    another: the same instructions run to run)."""
    sys.path.insert(0, str(ROOT))
    from bench import stream_w12

    async def main() -> None:
        engine, machine = stream_w12.setup(variant, "FULL", 0.2 if workload == "W2" else 0.0,
                                           pieces,
                                           os.path.join(tempfile.mkdtemp(), "s.db"))
        for count in (WARMUP, n):
            if count:
                await stream_w12.run(engine, machine, workload, count)
        await engine.aclose()
    asyncio.run(main())


def counted(runs: dict[str, list[str]], n: int) -> dict[str, float]:
    """Instructions per transition of each side: its command at ``--n`` 0 and ``n``, every
    side's run at once (two processes on two cores), read from callgrind's summary."""
    totals: dict[tuple[str, int], int] = {}
    folder = tempfile.mkdtemp(prefix="fsm-instructions-")
    for size in (0, n):
        procs = {}
        for side, cmd in runs.items():
            out = os.path.join(folder, f"{side}.{size}.out")
            procs[side] = subprocess.Popen(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd, str(size)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=folder,
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        for side, proc in procs.items():
            _, err = proc.communicate()
            found = re.search(r"Collected : (\d+)", err)
            if proc.returncode or not found:
                raise SystemExit(f"{side}: the run under valgrind failed: {err[-2000:]}")
            totals[side, size] = int(found.group(1))
    return {side: (totals[side, n] - totals[side, 0]) / (n * TRANSITIONS) for side in runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    trees = sub.add_parser("trees", help="this checkout against another, W1/W2")
    trees.add_argument("--base", required=True, help="the other checkout")
    trees.add_argument("--base-python", required=True, help="an interpreter with it installed")
    trees.add_argument("--workload", default="W2", choices=("W2", "W1N", "W1F"))
    trees.add_argument("--n", type=int, default=1000)
    stream = sub.add_parser("stream", help="a streamed call against a plain one, W2")
    stream.add_argument("--n", type=int, default=1000)
    stream.add_argument("--pieces", type=int, default=1)
    stream.add_argument("--workload", default="W2", choices=("W2", "W1"))
    if len(sys.argv) > 1 and sys.argv[1] == "--child":  # (one side's run: kind, 2 args, n)
        kind, a, b, n = sys.argv[2:6]
        if kind == "trees":
            child_trees(a, b, int(n))
        else:
            variant, _, workload = a.partition(":")
            child_stream(variant, int(b), int(n), workload or "W2")
        return
    args = ap.parse_args()
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    if args.mode == "trees":
        got = counted({"this": [*me, "trees", str(ROOT), args.workload],
                       "base": [args.base_python, str(Path(__file__).resolve()), "--child",
                                "trees", str(Path(args.base).resolve()), args.workload]}, args.n)
        label = f"{args.workload}, {args.n} instances"
    else:
        got = counted({v: [*me, "stream", f"{v}:{args.workload}", str(args.pieces)]
                       for v in ("plain", "stream")}, args.n)
        label = (f"{args.workload} s2 calling the model, {args.n} instances, "
                 f"{args.pieces} piece(s)")
    first, second = got
    for side, per in got.items():
        print(f"{label}: {side} {per / 1000:.1f}k instructions per transition")
    print(f"{label}: {second} / {first} = {got[second] / got[first]:.3f}"
          if args.mode == "stream" else f"{label}: this / base = {got[first] / got[second]:.3f}")


if __name__ == "__main__":
    main()
