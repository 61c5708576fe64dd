"""The viewer and the read side at 100,000 instances (issue 13): reported, not asserted.

    python bench/viewer.py [--n 100000] [--db PATH] [--reps 5]

Builds (once, or reuses ``--db``) a database of ``n`` instances of two machines, each
with 4 history rows and realistic contexts (~1 KiB), a tenth failed, a tenth still
running; then times, as medians of ``--reps`` runs:

* store queries: the first page (newest 50), a page sorted by tokens, a filtered
  page (machine + status), a text search, ``count`` by status;
* HTTP pages served by the real app (Starlette test client, so no network): the
  list page (first page, sorted, filtered, page 1,000), one instance page, and
  one machine page (the aggregate diagram over all its instances);
* ``fsm stats``' figures for one machine (``machine_stats``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fsm_engine.store import HistoryRow, InstanceFilter, InstanceRecord, SqliteStore, StepCommit  # noqa: E402

MODULE = str(ROOT / "machines" / "moderation.py")
PATH = ["init", "collect", "preprocess", "infer", "validate"]


def build(db: str, n: int) -> None:
    """``n`` instances with 4 history rows each, in batches (synchronous=NORMAL for speed)."""
    store = SqliteStore(db, synchronous="NORMAL")
    now = time.time() - n
    text = "lorem ipsum dolor sit amet " * 40
    batch = 5000
    for start in range(0, n, batch):
        records = []
        for i in range(start, min(n, start + batch)):
            records.append(InstanceRecord(
                id=f"{i:012x}", machine="moderation" if i % 4 else "report", module=MODULE,
                fingerprint="bench", state="init", status="pending",
                context={"path": f"/data/{i}.txt", "text": text, "verdict_source": "model"},
                input={"path": f"/data/{i}.txt"}, max_transitions=30, token_budget=6000,
                created_at=now + i, updated_at=now + i, visits={"init": 1}))
        store.create(*records)
        commits = []
        for rec in records:
            rows = [HistoryRow(rec.id, s + 1, PATH[s], PATH[s + 1], f"t{s}", rec.created_at + s,
                               tokens=(int(rec.id, 16) % 97) * (s == 3), duration_ms=1.0 + s)
                    for s in range(4)]
            final = int(rec.id, 16) % 10
            new = InstanceRecord(**{f: getattr(rec, f) for f in rec.__slots__})  # type: ignore[attr-defined]
            new.state = "validate"
            new.status = "failed" if final == 3 else "running" if final == 7 else "completed"
            new.reason = "timeout" if final == 3 else None
            new.seq = new.loop_count = 4
            new.tokens_used = sum(r.tokens for r in rows)
            new.updated_at = rec.created_at + 4
            commits.append(StepCommit(new, rec.version, rows))
        store.commit(commits)
    store.close()


def timed(fn, reps: int) -> float:
    """Median wall milliseconds of ``fn()``."""
    fn()  # warm the page cache and any lazy import
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--db", default=None)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    db = args.db or os.path.join(tempfile.mkdtemp(prefix="fsm-viewer-"), "viewer.db")
    if not os.path.exists(db):
        t = time.perf_counter()
        build(db, args.n)
        print(f"built {args.n} instances in {time.perf_counter() - t:.1f} s: {db}")
    from starlette.testclient import TestClient

    from fsm_engine.stats import machine_stats
    from fsm_engine.ui import create_app
    store = SqliteStore(db, readonly=True)
    client = TestClient(create_app(store))
    some = store.query(InstanceFilter(), limit=1)[0].id

    def get(url: str):
        def go():
            r = client.get(url)
            assert r.status_code == 200, (url, r.status_code)
        return go
    cases = [
        ("query: newest 50", lambda: store.query(InstanceFilter())),
        ("query: 50 by tokens", lambda: store.query(InstanceFilter(), order="tokens")),
        ("query: machine + status", lambda: store.query(
            InstanceFilter(machine="moderation", statuses=("failed",)))),
        ("query: text search", lambda: store.query(InstanceFilter(text="/data/99999."))),
        ("count by status", lambda: store.count(InstanceFilter(), "status")),
        ("page /", get("/")),
        ("page /?sort=tokens", get("/?sort=tokens")),
        ("page /?machine=report&status=failed", get("/?machine=report&status=failed")),
        ("page /?page=1000", get("/?page=1000")),
        ("page /?q=/data/4242.", get("/?q=/data/4242.")),
        ("page /instances/ID", get(f"/instances/{some}")),
        ("page /machines/report", get("/machines/report")),
        ("stats: machine_stats(report)", lambda: machine_stats(store, InstanceFilter(machine="report"))),
    ]
    n = store.count(InstanceFilter()).get(None, 0)
    print(f"\n{n} instances, median of {args.reps}\n")
    print(f"| {'what':<40} | {'ms':>9} |\n|{'-' * 42}|{'-' * 11}|")
    for name, fn in cases:
        reps = args.reps if not name.startswith(("page /machines", "stats")) else max(1, args.reps // 2)
        print(f"| {name:<40} | {timed(fn, reps):9.1f} |", flush=True)
    store.close()


if __name__ == "__main__":
    main()
