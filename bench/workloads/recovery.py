"""W3 recovery: SIGKILL a runner with instances in flight, resume in a new process.

Three processes:

1. ``python -m bench.workloads.recovery run DB N``: starts ``N`` instances of
   ``bench_sleepy_logged`` (``s2`` awaits 0.2 s) and runs them all at once;
2. the parent (``measure``) watches the history table through a read-only
   connection and SIGKILLs the runner once ``KILL_AT × N`` transitions are
   committed (all instances are past ``s0``/``s1`` and some are past ``s2``);
3. ``python -m bench.workloads.recovery resume DB``: a fresh process opens
   the database, calls ``Engine.resume()`` and reports, as JSON, the time
   from that call to the first committed step and to all instances final.

Every action appends ``instance state visit pid`` to a side file when it
completes.  A step *executed twice* is one whose transition was committed
before the kill and whose action ran again after it; it must be 0.  An
action that completed but whose commit died with the runner is run again
by design (at-least-once); those are counted separately as ``reruns``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any

KILL_AT = 2.5          # kill after this many committed transitions per instance
SIDE_SUFFIX = ".side"


# -- the parent ----------------------------------------------------------------------
def _wait_line(proc: subprocess.Popen[str], want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            break
        if line.strip() == want:
            return
    raise RuntimeError(f"runner did not print {want!r} (exit code {proc.poll()})")


def _history_count(conn: sqlite3.Connection) -> int:
    try:
        return conn.execute("SELECT count(*) FROM history").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def measure(workdir: str, n: int, python: str = sys.executable,
            timeout: float = 300.0, profile: str | None = None) -> dict[str, Any]:
    """One kill-and-resume cycle on a fresh database; returns the resume report."""
    from ..common import TRANSITIONS, fresh_path
    path = fresh_path(workdir, "w3.db")
    side = path + SIDE_SUFFIX
    if os.path.exists(side):
        os.remove(side)
    env = {**os.environ, "FSM_BENCH_SIDEFILE": side, "FSM_BENCH_SLEEP": "0.2"}
    cmd = [python, "-m", "bench.workloads.recovery"]
    runner = subprocess.Popen(cmd + ["run", path, str(n)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        _wait_line(runner, "started", timeout)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        kill_at = int(KILL_AT * n)
        deadline = time.monotonic() + timeout
        while _history_count(conn) < kill_at and runner.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError("runner made no progress")
            time.sleep(0.002)
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        if runner.returncode != -signal.SIGKILL:
            raise RuntimeError(f"runner finished before the kill (exit {runner.returncode})")
        at_kill = _history_count(conn)
        in_flight = conn.execute("SELECT count(*) FROM instances WHERE status NOT IN "
                                 "('completed','failed','cancelled')").fetchone()[0]
        conn.close()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    args = cmd + ["resume", path] + (["--profile", profile] if profile else [])
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"resume failed: {out.stderr.strip().splitlines()[-1:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report.update(n=n, committed_at_kill=at_kill, in_flight_at_kill=in_flight,
                  expected_transitions=n * TRANSITIONS)
    return report


# -- the runner ------------------------------------------------------------------------
async def _run(path: str, n: int) -> None:
    from fsm_engine import Engine, SqliteStore

    from ..peers.fsm import SLEEPY_LOGGED
    engine = Engine(SqliteStore(path))
    engine.register(SLEEPY_LOGGED)
    ids = [engine.start(SLEEPY_LOGGED) for _ in range(n)]
    print("started", flush=True)
    await engine.run_many(ids)
    print("finished", flush=True)


# -- the resumer -----------------------------------------------------------------------
def _committed_steps(path: str) -> set[tuple[str, str, int]]:
    """(instance, state, visit) of every transition committed so far."""
    conn = sqlite3.connect(path)
    visits: collections.Counter[tuple[str, str]] = collections.Counter()
    done = set()
    for iid, source in conn.execute("SELECT i.id, h.source FROM history h JOIN instances i "
                                    "ON i.key = h.instance WHERE h.kind='transition' "
                                    "ORDER BY h.instance, h.seq"):
        visits[(iid, source)] += 1
        done.add((iid, source, visits[(iid, source)]))
    conn.close()
    return done


def _executions(side: str) -> dict[tuple[str, str, int], list[int]]:
    runs: dict[tuple[str, str, int], list[int]] = collections.defaultdict(list)
    with open(side) as fh:
        for line in fh:
            iid, state, visit, pid = line.split()
            runs[(iid, state, int(visit))].append(int(pid))
    return runs


async def _resume(path: str, profile: str | None) -> dict[str, Any]:
    from fsm_engine import Engine, SqliteStore

    from ..common import TRANSITIONS
    from ..peers.fsm import SLEEPY_LOGGED
    before = _committed_steps(path)
    engine = Engine(SqliteStore(path))
    engine.register(SLEEPY_LOGGED)
    first: list[float] = []
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    started = time.perf_counter()
    results = await engine.resume(on_step=lambda rec: first or first.append(time.perf_counter()))
    finished = time.perf_counter()
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    bad = [r for r in results if getattr(r, "status", None) != "completed"
           or r.context["n"] != TRANSITIONS]
    await engine.aclose()
    me = os.getpid()
    runs = _executions(path + SIDE_SUFFIX)
    twice = sum(1 for key, pids in runs.items() if key in before and me in pids)
    reruns = sum(1 for key, pids in runs.items() if key not in before and len(pids) > 1)
    after = _committed_steps(path)
    conn = sqlite3.connect(path)
    takeovers = conn.execute("SELECT count(*) FROM history WHERE kind='recovery'").fetchone()[0]
    conn.close()
    return {"takeovers": takeovers, "first_step_s": (first[0] - started) if first else None,
            "all_final_s": finished - started, "resumed": len(results),
            "not_completed": len(bad), "executed_twice": twice, "reruns": reruns,
            "committed_total": len(after)}


def main(argv: list[str]) -> int:
    if argv[0] == "run":
        asyncio.run(_run(argv[1], int(argv[2])))
        return 0
    profile = argv[argv.index("--profile") + 1] if "--profile" in argv else None
    print(json.dumps(asyncio.run(_resume(argv[1], profile))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
