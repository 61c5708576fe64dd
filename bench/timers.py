"""Timer edges (issue 38): what 10,000 waiting instances cost, and how late their timers fire.

    python bench/timers.py [--n 10000] [--idle 10] [--concurrency 32] [--workers 1] [--postgres]

1. **idle**: ``n`` instances wait in a state whose timer falls due in an hour; one
   ``fsm worker`` runs ``--idle`` seconds beside them, and as long beside an empty store:
   the worker's CPU (``/proc/PID/stat``, user + system) per second, both, and their
   ratio (target: ~1, no per-instance work while nothing is due).  The claim query's
   plan is printed (SQLite: ``EXPLAIN QUERY PLAN``): the waiting arm must search the
   partial index ``idx_instances_timers`` (``next_attempt_at`` of waiting rows), covering.
2. **lateness**: ``n`` instances whose timers all fall due in the same second (a callable
   delay returning one aware ``datetime``); ``--workers`` workers (``--concurrency`` each) fire
   them: each fire's ``detail.timer.lateness_s`` p50 / p99 / max, and the seconds until the
   last fired.

``--postgres``: the same on a throwaway PostgreSQL cluster (``testing.postgres``; a fresh
database per part; the plan is SQLite's only), the table analysed after the arming as
autovacuum would within its minute (``--no-analyze``: not; see ``_analyze``).

Results go to ``bench/RESULTS.md`` by hand (the machine and the load vary).
"""

from __future__ import annotations

import argparse
import asyncio
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

from fsm_engine import Engine  # noqa: E402
from fsm_engine.store import InstanceFilter  # noqa: E402

MACHINE = '''
from datetime import UTC, datetime
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class Ctx(BaseModel):
    due: float = 0.0

def due_at(ctx: Ctx) -> datetime:
    return datetime.fromtimestamp(ctx.due, UTC)

machine = Machine(name="timed", context=Ctx, initial="start",
                  states=[State("start"), State("wait", wait=True),
                          State("replied", final=True), State("fired", final=True)],
                  transitions=[Transition("go", "start", "wait"),
                               Transition("reply", "wait", "replied"),
                               Transition("fire", "wait", "fired", after=due_at)])
'''


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _worker(db: str, module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", "worker", "--db", db,
                             "--machines", module, "--poll", "1",
                             "--concurrency", env.get("BENCH_CONCURRENCY", "32")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _armed(db: str, module: str, n: int, due: float) -> float:
    """Start ``n`` instances waiting on a timer due at ``due``; the seconds it took."""
    started = time.perf_counter()
    engine = Engine(db)
    try:
        for lo in range(0, n, 1000):
            ids = engine.start_many(module, [{"due": due}] * min(1000, n - lo))
            asyncio.run(engine.run_many(ids))
    finally:
        engine.close()
    return time.perf_counter() - started


def _idle_cpu(db: str, module: str, env: dict[str, str], seconds: float) -> float:
    """CPU seconds per second of one worker over ``seconds`` (after a 2 s warm-up)."""
    proc = _worker(db, module, env)
    try:
        time.sleep(2.0)
        before, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        return (_cpu_s(proc.pid) - before) / (time.monotonic() - t0)
    finally:
        proc.terminate()
        proc.wait(30)


def _plan(db: str) -> list[str]:
    """SQLite's plan of a worker's claim query (``store.sqlite.store.claim_sql``, for the
    machine it serves), one line per step."""
    import sqlite3

    from fsm_engine.store.claims import ClaimRequest, where
    from fsm_engine.store.sqlite.store import claim_sql
    req = ClaimRequest(owner="bench", now=time.time(), limit=10, lease_seconds=30.0,
                       machines=["timed"])
    sql, args = claim_sql(*where(req), 10)
    with sqlite3.connect(db) as conn:
        return [str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]


def _analyze(url: str) -> None:
    """``ANALYZE instances``: what autovacuum does within a minute of the arming (its
    ``autovacuum_naptime``), which the bench does not wait for.  Without statistics of
    10,000 rows turned ``waiting``, the planner takes them for one and claims with a
    bitmap scan and a sort of every due row (22 ms per claim of 512 here, against 1.3 ms
    walking the rank index once the statistics exist: ``EXPLAIN ANALYZE``)."""
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE instances")


def _lateness(db: str, module: str, env: dict[str, str], n: int,
              workers: int = 1, analyze: bool = True) -> dict[str, Any]:
    """Arm ``n`` timers due in the same second, fire them with ``workers`` workers
    (PostgreSQL: with the table analysed after the arming, unless ``analyze`` is False)."""
    lead = 5.0 + n / 1500.0  # time to arm them all before they fall due
    due = float(int(time.time() + lead))
    arm_s = _armed(db, module, n, due)
    if analyze and "://" in db:
        _analyze(db)
    if time.time() >= due:
        raise SystemExit(f"arming {n} timers took {arm_s:.1f} s, past their due time")
    procs = [_worker(db, module, env) for _ in range(workers)]
    engine = Engine(db)
    try:
        done = InstanceFilter(statuses=("completed",))
        while sum(engine.store.count(done).values()) < n:  # a COUNT: no rows decoded
            time.sleep(0.5)
        late = sorted(float(row.detail["timer"]["lateness_s"])
                      for rec in engine.store.list() for row in engine.store.history(rec.id)
                      if row.kind == "timer")
        last = max(rec.updated_at for rec in engine.store.list())
    finally:
        engine.close()
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    q = statistics.quantiles(late, n=100)
    return {"fired": len(late), "p50_s": q[49], "p99_s": q[98], "max_s": late[-1],
            "drain_s": last - due, "arm_s": arm_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="the worker's --concurrency (32: its default)")
    parser.add_argument("--workers", type=int, default=1, help="workers firing the due timers")
    parser.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL cluster")
    parser.add_argument("--no-analyze", action="store_true",
                        help="PostgreSQL: fire before the table's statistics exist")
    args = parser.parse_args()
    cluster = None
    if args.postgres:
        from fsm_engine.testing.postgres import PostgresCluster
        cluster = PostgresCluster().start()
    try:
        _run(args, cluster)
    finally:
        if cluster is not None:
            cluster.stop()


def _run(args: argparse.Namespace, cluster: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="fsm-bench-timers-") as tmp:
        module = str(Path(tmp) / "timed.py")
        Path(module).write_text(MACHINE)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
            "PYTHONPATH", "")]), "FSM_MACHINES_ROOT": tmp,
               "BENCH_CONCURRENCY": str(args.concurrency)}
        def fresh(name: str) -> str:
            return cluster.database() if cluster else str(Path(tmp) / name)
        print(f"store: {'postgresql' if cluster else 'sqlite'}")  # (a URL may hold a password)
        empty, busy = fresh("empty.db"), fresh("waiting.db")
        Engine(empty).close()
        arm_s = _armed(busy, module, args.n, time.time() + 3600)
        print(f"armed {args.n} timers in {arm_s:.1f} s")
        if cluster is None:
            print("claim plan:", *_plan(busy), sep="\n  ")
        cpu_empty = _idle_cpu(empty, module, env, args.idle)
        cpu_busy = _idle_cpu(busy, module, env, args.idle)
        print(f"idle worker CPU: {cpu_empty * 100:.2f} % (empty store), "
              f"{cpu_busy * 100:.2f} % ({args.n} waiting): ratio {cpu_busy / cpu_empty:.2f}")
        got = _lateness(fresh("due.db"), module, env, args.n, args.workers,
                       analyze=not args.no_analyze)
        print(f"{got['fired']} timers due in one second, {args.workers} worker(s) at "
              f"--concurrency {args.concurrency}: lateness p50 "
              f"{got['p50_s']:.3f} s, p99 {got['p99_s']:.3f} s, max {got['max_s']:.3f} s; "
              f"all fired {got['drain_s']:.2f} s after the due second (armed in "
              f"{got['arm_s']:.1f} s)")


if __name__ == "__main__":
    main()
