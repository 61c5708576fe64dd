"""Schedules (issue 38): 1,000 stored schedules and one ``fsm worker``.

    python bench/schedules.py [--n 1000] [--every 10] [--seconds 35] [--poll 0.5]
                              [--db postgresql://… | --postgres]

Two phases on one store (a fresh SQLite file unless ``--db``; ``--postgres``: a fresh
PostgreSQL server of the test kit's, ``fsm_engine.testing.postgres``, fsync on):

1. **idle**: ``n`` schedules that are not due (a daily cron at 03:00): the worker's CPU
   per poll (its CPU seconds from ``/proc/PID/stat`` over ``--idle`` seconds, divided by
   the polls the interval holds) — what a worker pays to look at schedules while nothing
   is due (one indexed query for the due rows, one for the next tick, per poll);
2. **ticking**: the same ``n`` schedules every ``--every`` seconds (added back to back, so
   their ticks spread over the time the adds took): for ``--seconds`` seconds, every
   tick's lateness — its instance's ``created_at`` minus the tick — p50/p99/max, the ticks
   fired against the ticks due, and the worker's CPU per second.

The worker runs the tick machine of the tests (one step, no model).  Prints one line per
measure; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from fsm_engine import Engine  # noqa: E402
from fsm_engine.runtime.schedule_spec import ticks  # noqa: E402

TICKED = str(ROOT / "tests" / "helpers" / "tick_machine.py")
#: ``fsm`` as a real process (the interpreter running the tests, this tree on its path).
FSM = [sys.executable, "-m", "fsm_engine.cli"]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def worker(url: str, poll: float, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FSM_MACHINES_ROOT=str(ROOT))
    return subprocess.Popen([*FSM, "worker", "--db", url, "--poll", str(poll), "--lease", "5"],
                            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def add_all(engine: Engine, n: int, **when: Any) -> float:
    """``n`` schedules ``s0000``…; the seconds the adds took."""
    began = time.monotonic()
    for i in range(n):
        engine.schedules.add(f"s{i:04d}", TICKED, overlap="allow", **when)
    return time.monotonic() - began


def pct(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


def idle(url: str, args: argparse.Namespace, log: Path) -> None:
    engine = Engine(url)
    try:
        add_all(engine, args.n, cron="0 3 * * *")
    finally:
        engine.close()
    proc = worker(url, args.poll, log)
    try:
        time.sleep(3.0)  # started, registered, first look taken
        before, t0 = cpu_s(proc.pid), time.monotonic()
        time.sleep(args.idle)
        spent, wall = cpu_s(proc.pid) - before, time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    polls = wall / args.poll
    print(f"idle: {args.n} schedules not due, poll {args.poll:g}s: worker CPU "
          f"{spent * 1000 / polls:.2f} ms per poll ({spent / wall * 100:.1f} % of a core)")


def ticking(url: str, args: argparse.Namespace, log: Path) -> None:
    engine = Engine(url)
    try:
        for row in engine.schedules.list():
            engine.schedules.delete(row.name)
        took = add_all(engine, args.n, every=f"{args.every:g}s")
    finally:
        engine.close()
    print(f"added {args.n} schedules every {args.every:g}s in {took:.1f}s")
    proc = worker(url, args.poll, log)
    began = time.time()
    cpu0 = cpu_s(proc.pid)
    try:
        time.sleep(args.seconds)
        spent = cpu_s(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(60)
    ended = time.time()
    engine = Engine(url)
    try:
        rows = {r.name: r for r in engine.schedules.list()}
        late: list[float] = []
        due = 0
        for row in rows.values():
            due += len(ticks(row, began + 2.0, ended - 2.0, 100_000))  # (started, stopped)
        for rec in engine.store.list():
            name, _, stamp = rec.id.partition("-")
            if name not in rows:
                continue
            tick = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
            if began + 2.0 <= tick <= ended - 2.0:
                late.append(rec.created_at - tick)
    finally:
        engine.close()
    print(f"ticking: {len(late)} ticks fired of {due} due in the window; lateness p50 "
          f"{pct(late, 0.5) * 1000:.0f} ms, p99 {pct(late, 0.99) * 1000:.0f} ms, max "
          f"{max(late, default=float('nan')) * 1000:.0f} ms (mean "
          f"{statistics.fmean(late) * 1000 if late else float('nan'):.0f} ms); worker CPU "
          f"{spent / args.seconds * 100:.0f} % of a core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=35.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--db", default=None)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    cluster = None
    if args.postgres:
        from fsm_engine.testing.postgres import PostgresCluster
        cluster = PostgresCluster().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            url = cluster.database() if cluster else args.db or str(Path(tmp) / "sched.db")
            print(f"store: {'postgresql' if cluster or '://' in url else 'sqlite'}")  # no URL:
            # (a URL may carry a password)
            idle(url, args, Path(tmp) / "idle.log")
            ticking(url, args, Path(tmp) / "ticking.log")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
