"""Scale-out on PostgreSQL (issue 8): durable transitions/s with 1, 2 and 4 `fsm worker`s,
pickup latency from `fsm start`-style enqueue to the first step, and takeover time after a
SIGKILL.

    python bench/scale_out.py [--n 2000] [--workers 1,2,4] [--delay 0.05] [--lease 5]

Runs a throwaway cluster (``fsm_engine.testing.postgres``: fsync and
synchronous_commit on, loopback) and the reference machine with a scripted model
answering after ``--delay`` seconds.  Prints one line per figure; nothing is
asserted (the properties are asserted by ``tests/test_scale_out.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("FSM_MACHINES_ROOT", str(ROOT))

from fsm_engine.store import open_store  # noqa: E402
from fsm_engine.testing.postgres import PostgresCluster  # noqa: E402
from scale_harness import Fleet, Sink, completed, enqueue, wait_until  # noqa: E402

STEPS = 7  # transitions per instance of the reference machine


def _first_steps(url: str) -> dict[str, float]:
    """Instance id -> time of its first history row."""
    import psycopg
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT i.id, h.at FROM history h JOIN instances i "
                            "ON i.key = h.instance WHERE h.seq = 1").fetchall()
    return {r[0]: r[1] for r in rows}


def throughput(cluster: PostgresCluster, sink: Sink, workers: int, n: int, delay: float,
               lease: float, folder: Path) -> float:
    url = cluster.database()
    open_store(url).close()
    fleet = Fleet(url, folder, sink, lease=lease, concurrency=100, delay_s=delay)
    fleet.spawn(workers)
    store = open_store(url)
    try:
        time.sleep(2.0)  # workers up and idle, listening
        start = time.time()
        enqueue(url, n)
        wait_until(lambda: completed(store) == n, 1800, "every instance", interval=0.25)
        elapsed = time.time() - start
    finally:
        store.close()
        fleet.stop()
    return n * STEPS / elapsed


def pickup(cluster: PostgresCluster, sink: Sink, folder: Path, lease: float) -> list[float]:
    """Latencies (s) from the enqueue's commit to the first committed step, one at a time."""
    url = cluster.database()
    open_store(url).close()
    fleet = Fleet(url, folder, sink, lease=lease, concurrency=10, poll=1.0)
    fleet.spawn(1)
    out = []
    try:
        time.sleep(2.0)
        for _ in range(30):
            t0 = time.time()
            [iid] = enqueue(url, 1)
            store = open_store(url)
            wait_until(lambda: bool(store.history(iid)), 30, "a first step", interval=0.002)
            store.close()
            out.append(_first_steps(url)[iid] - t0)
            time.sleep(0.3)
    finally:
        fleet.stop()
    return out


def takeover(cluster: PostgresCluster, sink: Sink, folder: Path, lease: float,
             delay: float) -> float:
    """Seconds from SIGKILL of a worker holding instances to one of them stepping elsewhere.

    The killed worker's pid is gone, so a worker on the same host takes over at once;
    the figure for other hosts is the lease."""
    url = cluster.database()
    open_store(url).close()
    slow = Fleet(url, folder, sink, lease=lease, concurrency=50, delay_s=max(delay, 1.0))
    slow.spawn(1)
    ids = enqueue(url, 50)
    store = open_store(url)
    other = None
    try:
        wait_until(lambda: sum(len(store.held(w.id)) for w in store.workers()) == 50, 60,
                   "all held")
        before = {i: len(store.history(i)) for i in ids}
        slow.procs[0].send_signal(signal.SIGKILL)
        killed = time.time()
        other = Fleet(url, folder, sink, lease=lease, concurrency=50, delay_s=delay)
        other.spawn(1)
        wait_until(lambda: any(len(store.history(i)) > before[i] for i in ids), 120,
                   "a step after the takeover", interval=0.01)
        return time.time() - killed
    finally:
        store.close()
        slow.stop()
        if other is not None:
            other.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--delay", type=float, default=0.05)
    ap.add_argument("--lease", type=float, default=5.0)
    args = ap.parse_args()
    sink = Sink()
    folder = Path(tempfile.mkdtemp(prefix="fsm-scale-"))
    with PostgresCluster() as cluster:
        base = None
        for w in [int(x) for x in args.workers.split(",")]:
            rate = throughput(cluster, sink, w, args.n, args.delay, args.lease, folder)
            base = base or rate
            print(f"{w} worker(s), {args.n} instances, {args.delay * 1000:.0f} ms model: "
                  f"{rate:,.0f} durable transitions/s ({rate / base:.2f}x one worker)")
        lat = pickup(cluster, sink, folder, args.lease)
        print(f"pickup latency enqueue -> first step: p50 {statistics.median(lat) * 1000:.1f} ms,"
              f" max {max(lat) * 1000:.1f} ms (30 single instances, LISTEN/NOTIFY)")
        took = takeover(cluster, sink, folder, args.lease, args.delay)
        print(f"SIGKILL -> stepping again on another worker (same host): {took:.2f} s "
              f"({took / args.lease:.2f} lease periods; lease {args.lease:g} s)")
    sink.close()


if __name__ == "__main__":
    main()
