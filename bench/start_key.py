"""The cost of an idempotent start over a plain one (issue 38), SQLite and PostgreSQL.

    python bench/start_key.py [--n 2000] [--rounds 5] [--backend sqlite|postgres|both]

Each round starts ``n`` instances of a one-state machine three ways, one transaction each
(``Engine.start``): plain, with a fresh ``key`` each (``key=``: the unique index's insert),
and again with keys already taken (the repeat: the refused insert, then the read of the
holder; nothing written).  The three run interleaved in every round on one store, and
the median of the rounds' CPU seconds (``time.process_time``: this process only, so a
PostgreSQL server's own work is not in it; wall seconds are printed beside) is divided
by the plain start's: the ratios are what to compare on a shared machine.  PostgreSQL
uses a throwaway cluster (``fsm_engine.testing.postgres``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "helpers")]

from start_machine import MACHINE  # noqa: E402

from fsm_engine import Engine  # noqa: E402


@contextmanager
def _store(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"{tmp}/fsm.db"
        return
    from fsm_engine.testing.postgres import PostgresCluster
    cluster = PostgresCluster(durable=False).start()
    try:
        yield cluster.database()
    finally:
        cluster.stop()


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def measure(url: str, n: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Per way (plain, keyed, repeat), each round's (CPU s, wall s) for ``n`` starts."""
    engine = Engine(url)
    engine.register(MACHINE)
    for i in range(50):  # warm-up: imports, statements prepared, pages cached
        engine.start(MACHINE, {"n": 1}, key=f"warm{i}")
    got: dict[str, list[tuple[float, float]]] = {"plain": [], "keyed": [], "repeat": []}
    for r in range(rounds):
        keys = [f"r{r}-{i}" for i in range(n)]
        got["plain"].append(_timed(lambda: [engine.start(MACHINE, {"n": 1}) for _ in keys]))
        got["keyed"].append(_timed(lambda: [engine.start(MACHINE, {"n": 1}, key=k)
                                            for k in keys]))
        got["repeat"].append(_timed(lambda: [engine.start(MACHINE, {"n": 1}, key=k)
                                             for k in keys]))
    engine.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="starts per way per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres", "both"))
    args = ap.parse_args()
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    for backend in backends:
        with _store(backend) as url:
            got = measure(url, args.n, args.rounds)
        cpu = {way: statistics.median(c for c, _ in rows) for way, rows in got.items()}
        wall = {way: statistics.median(w for _, w in rows) for way, rows in got.items()}
        for way in got:
            print(f"{backend} {way:6}: {1e6 * cpu[way] / args.n:7.1f} µs CPU, "
                  f"{1e6 * wall[way] / args.n:7.1f} µs wall per start; "
                  f"CPU / plain = {cpu[way] / cpu['plain']:.3f}, "
                  f"wall / plain = {wall[way] / wall['plain']:.3f}")


if __name__ == "__main__":
    main()
