"""Scale-out on PostgreSQL (issue 8): durable transitions/s with 1, 2 and 4 `fsm worker`s,
pickup latency from `fsm start`-style enqueue to the first step, and takeover time after a
SIGKILL.

    python bench/scale_out.py [--n 2000] [--workers 1,2,4] [--delay 0.05] [--lease 5] [--no-dbos]

Runs a throwaway cluster (``fsm_engine.testing.postgres``: fsync and
synchronous_commit on, loopback) and the reference machine with a scripted model
answering after ``--delay`` seconds.  Prints one line per figure; nothing is
asserted (the properties are asserted by ``tests/runtime/fleet/test_scale_out.py``).

Each run waits for its workers to register (they load the machine at start,
``--machines``) and for a warm-up of ``WARM`` instances per worker, then measures
``--n`` more.  Besides the rate (which depends on what else the 2 cores run), each fsm run
prints two figures that do not: the workers' CPU time per transition (from
``/proc``) and the database transactions per transition
(``pg_stat_database.xact_commit``).  The peer, DBOS Transact with its system
database on the same cluster (``bench/peers/dbos_scale.py``), runs the same
shape (7 durable steps, a 50 ms model step) from a queue served by the same
number of processes; the ratio fsm/DBOS is printed per worker count (``dbos``
from ``bench/requirements.txt`` in the venv running this script; ``--no-dbos``
skips it).  ``--sqlite 3`` (the default) also runs three workers on one SQLite
file, the single-host path.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "helpers")]
os.environ.setdefault("FSM_MACHINES_ROOT", str(ROOT))

from scale_harness import MODERATION, Fleet, Sink, completed, enqueue, wait_until  # noqa: E402

from fsm_engine.store import open_store  # noqa: E402
from fsm_engine.testing.postgres import PostgresCluster  # noqa: E402

STEPS = 7  # transitions per instance of the reference machine


def _first_steps(url: str) -> dict[str, float]:
    """Instance id -> time of its first history row."""
    import psycopg
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT i.id, h.at FROM history h JOIN instances i "
                            "ON i.key = h.instance WHERE h.seq = 1").fetchall()
    return {r[0]: r[1] for r in rows}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(cluster: PostgresCluster) -> dict[int, float]:
    """CPU seconds of each live process of the server (the postmaster's children)."""
    master = int(Path(cluster.data, "postmaster.pid").read_text().split()[0])
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf(
                "SC_CLK_TCK")
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the server spent between two ``server_cpu`` readings (processes that
    ended meanwhile are missed: read ``after`` before the clients disconnect)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def commits(cluster: PostgresCluster) -> int:
    """Transactions committed in the cluster's ``postgres`` database so far."""
    time.sleep(1.5)  # backends report their counts when idle, at most once a second
    return int(cluster.sql("SELECT xact_commit FROM pg_stat_database "
                           "WHERE datname = 'postgres'")[0][0])


class Rate(NamedTuple):
    """One throughput run: transitions/s, worker and server CPU ms and transactions per
    transition."""

    per_s: float
    cpu_ms: float
    server_ms: float
    xacts: float


#: Instances per worker run before the measured ones (connections opened, the webhook
#: client and the validators built).
WARM = 20


def ready(url: str, store: Any, fleet: Fleet, workers: int) -> int:
    """Once every worker is registered (each loads the machine at start, ``--machines``)
    and a warm-up of ``WARM`` instances per worker has completed: how many completed."""
    wait_until(lambda: len(store.workers()) >= workers, 300, "the workers registered")
    enqueue(url, WARM * workers)
    wait_until(lambda: completed(store) == WARM * workers, 300, "the warm-up", interval=0.1)
    return WARM * workers


def fleet_of(url: str, folder: Path, sink: Sink, lease: float, delay: float) -> Fleet:
    return Fleet(url, folder, sink, lease=lease, concurrency=100, delay_s=delay,
                 args=("--machines", MODERATION))


def throughput(cluster: PostgresCluster, sink: Sink, workers: int, n: int, delay: float,
               lease: float, folder: Path) -> Rate:
    return _fleet_rate(cluster.database(), sink, workers, n, delay, lease, folder, cluster)


def sqlite_throughput(sink: Sink, workers: int, n: int, delay: float, lease: float,
                      folder: Path) -> Rate:
    """The same run on one SQLite file shared by ``workers`` processes on this host."""
    url = str(folder / f"sqlite-{workers}-{int(time.time())}.db")
    return _fleet_rate(url, sink, workers, n, delay, lease, folder)


def _fleet_rate(url: str, sink: Sink, workers: int, n: int, delay: float, lease: float,
                folder: Path, cluster: PostgresCluster | None = None) -> Rate:
    """``workers`` `fsm worker`s on ``url`` running ``n`` instances after the warm-up;
    with ``cluster`` (PostgreSQL) also the server's CPU and transactions per transition
    (else 0.0 and NaN)."""
    open_store(url).close()
    fleet = fleet_of(url, folder, sink, lease, delay)
    fleet.spawn(workers)
    store = open_store(url)
    server, xacts = 0.0, float("nan")
    try:
        n0 = ready(url, store, fleet, workers)
        cpu0 = sum(cpu_seconds(p.pid) for p in fleet.procs)
        if cluster is not None:
            xact0, server0 = commits(cluster), server_cpu(cluster)
        start = time.time()
        enqueue(url, n)
        wait_until(lambda: completed(store) == n0 + n, 1800, "every instance", interval=0.25)
        elapsed = time.time() - start
        cpu = sum(cpu_seconds(p.pid) for p in fleet.procs) - cpu0
        if cluster is not None:
            server = spent(server0, server_cpu(cluster))
            xacts = commits(cluster) - xact0  # (the bench's polls, ~4/s, are counted too)
    finally:
        store.close()
        fleet.stop()
    total = n * STEPS
    return Rate(total / elapsed, cpu / total * 1000, server / total * 1000,
                xacts / total)


def dbos_throughput(cluster: PostgresCluster, workers: int, n: int, delay: float,
                    folder: Path) -> Rate:
    """The same shape on DBOS: ``workers`` processes serving one queue on the cluster."""
    import psycopg
    from peers.dbos_scale import done
    from peers.dbos_scale import enqueue as dbos_enqueue
    name = f"dbos_{workers}_{int(time.time())}"
    cluster.sql(f"CREATE DATABASE {name}")
    url = cluster.url(name)
    procs = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT)]))
    try:
        for i in range(workers):
            log = open(folder / f"dbos{i}.log", "wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "peers.dbos_scale", url, f"bench-{i}", "100", "0.2",
                 str(delay)], cwd=ROOT / "bench", env=env, stdout=log,
                stderr=subprocess.STDOUT))
        wait_until(lambda: all((folder / f"dbos{i}.log").read_text().startswith("ready")
                               for i in range(workers)), 120, "DBOS workers launched")
        with psycopg.connect(url, autocommit=True) as conn:
            cpu0, server0 = sum(cpu_seconds(p.pid) for p in procs), server_cpu(cluster)
            start = time.time()
            dbos_enqueue(url, n)
            wait_until(lambda: done(conn) == n, 1800, "every workflow", interval=0.25)
            elapsed = time.time() - start
            cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
            server = spent(server0, server_cpu(cluster))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    total = n * STEPS
    return Rate(total / elapsed, cpu / total * 1000, server / total * 1000, float("nan"))


def pickup(cluster: PostgresCluster, sink: Sink, folder: Path, lease: float) -> list[float]:
    """Latencies (s) from an instance's creation (its ``created_at``, stamped just before the
    enqueue's commit) to its first committed step (the history row's ``at``), one at a time."""
    url = cluster.database()
    open_store(url).close()
    fleet = Fleet(url, folder, sink, lease=lease, concurrency=10, poll=1.0)
    fleet.spawn(1)
    out = []
    try:
        time.sleep(2.0)
        store = open_store(url)
        for _ in range(40):
            [iid] = enqueue(url, 1)
            wait_until(lambda: bool(store.history(iid)), 30, "a first step", interval=0.005)
            out.append(_first_steps(url)[iid] - store.get(iid).created_at)
            time.sleep(0.3)
        store.close()
    finally:
        fleet.stop()
    return out


def takeover(cluster: PostgresCluster, sink: Sink, folder: Path, lease: float,
             delay: float) -> float:
    """Seconds from SIGKILL of a worker holding instances to one of them stepping elsewhere.

    The other worker runs already (idle: the killed one holds every instance), as in a
    fleet; the killed worker's pid is gone, so a worker on the same host takes it over at
    its next claim (``--poll``); on other hosts, when the lease expires (+ a poll)."""
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
        other = Fleet(url, folder, sink, lease=lease, concurrency=50, delay_s=delay)
        other.spawn(1)
        wait_until(lambda: len(store.workers()) == 2, 60, "the other worker registered")
        slow.procs[0].send_signal(signal.SIGKILL)
        killed = time.time()
        slow.procs[0].wait()  # no commit of the killed worker after this read
        before = {i: len(store.history(i)) for i in ids}
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
    ap.add_argument("--no-dbos", action="store_true", help="Skip the DBOS peer.")
    ap.add_argument("--sqlite", type=int, default=3,
                    help="Also run this many workers on one SQLite file (0: skip).")
    args = ap.parse_args()
    if not args.no_dbos:
        try:
            import dbos  # noqa: F401
        except ImportError:
            print("DBOS is not installed (pip install -r bench/requirements.txt): "
                  "the peer is skipped", flush=True)
            args.no_dbos = True
    sink = Sink()
    folder = Path(tempfile.mkdtemp(prefix="fsm-scale-"))
    with PostgresCluster() as cluster:
        base = None
        for w in [int(x) for x in args.workers.split(",")]:
            rate = throughput(cluster, sink, w, args.n, args.delay, args.lease, folder)
            base = base or rate.per_s
            print(f"{w} worker(s), {args.n} instances, {args.delay * 1000:.0f} ms model: "
                  f"{rate.per_s:,.0f} durable transitions/s ({rate.per_s / base:.2f}x one "
                  f"worker); per transition: worker CPU {rate.cpu_ms:.2f} ms, server CPU "
                  f"{rate.server_ms:.2f} ms, {rate.xacts:.2f} database transactions",
                  flush=True)
            if not args.no_dbos:
                peer = dbos_throughput(cluster, w, args.n, args.delay, folder)
                print(f"  DBOS, {w} process(es), same workload: {peer.per_s:,.0f} durable "
                      f"transitions/s ({peer.per_s / STEPS:,.0f} workflows/s); per "
                      f"transition: worker CPU {peer.cpu_ms:.2f} ms, server CPU "
                      f"{peer.server_ms:.2f} ms; fsm/DBOS "
                      f"{rate.per_s / peer.per_s:.2f}x", flush=True)
        if args.sqlite:
            lite = sqlite_throughput(sink, args.sqlite, args.n, args.delay, args.lease, folder)
            print(f"SQLite, {args.sqlite} workers on one file: {lite.per_s:,.0f} durable "
                  f"transitions/s; worker CPU {lite.cpu_ms:.2f} ms per transition", flush=True)
        lat = sorted(pickup(cluster, sink, folder, args.lease))
        p95 = lat[int(len(lat) * 0.95) - 1]
        print(f"pickup latency enqueue -> first step: p50 {statistics.median(lat) * 1000:.1f} ms,"
              f" p95 {p95 * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms ({len(lat)} single "
              "instances, LISTEN/NOTIFY)", flush=True)
        took = takeover(cluster, sink, folder, args.lease, args.delay)
        print(f"SIGKILL -> stepping again on another worker (same host): {took:.2f} s "
              f"({took / args.lease:.2f} lease periods; lease {args.lease:g} s)")
    sink.close()


if __name__ == "__main__":
    main()
