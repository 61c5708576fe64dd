"""The operator console (issue 25): bulk actions per second and console pages, reported.

    python bench/console.py [--n 10000] [--pages-n 100000] [--batch 500] [--no-postgres]

* Bulk: ``n`` pending instances (a SQLite file with the store's defaults, then a
  throwaway PostgreSQL cluster as in the tests), then ``pause``, ``unpause`` and
  ``cancel`` of all of them by query (``Engine.bulk``: batches of ``--batch``, one
  transaction each, compare-and-set per instance), each timed once: instances/s.
* Pages: ``bench/viewer.py``'s database of ``--pages-n`` instances, served by the app
  with the console on (Starlette's test client): an instance page with its action
  links, an action's confirmation page, a bulk confirmation page (count + sample of a
  filtered query) and the list page; medians of 5, in ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.viewer import build, timed  # noqa: E402
from fsm_engine import Engine  # noqa: E402
from fsm_engine.store import InstanceFilter, InstanceRecord, open_store  # noqa: E402


def _fill(url: str, n: int) -> None:
    store = open_store(url, create=True)
    now = time.time()
    try:
        for start in range(0, n, 5000):
            store.create(*[InstanceRecord(
                id=f"b{i:011x}", machine="bulk", module="bench", fingerprint="bench",
                state="work", status="pending", context={"i": i}, input={"i": i},
                max_transitions=10, token_budget=None, created_at=now + i, updated_at=now + i,
                visits={"work": 1}) for i in range(start, min(n, start + 5000))])
    finally:
        store.close()


def bulk_rates(url: str, n: int, batch: int) -> list[tuple[str, float, int]]:
    """(action, instances/s, changed) for pause, unpause and cancel of all ``n``."""
    _fill(url, n)
    eng = Engine(url, llm=None)
    out = []
    try:
        for action in ("pause", "unpause", "cancel"):
            t = time.perf_counter()
            plan = eng.bulk_plan(action, InstanceFilter(machine="bulk"))
            done = eng.bulk(plan, by="bench", batch=batch)
            out.append((action, done.changed / (time.perf_counter() - t), done.changed))
    finally:
        eng.close()
    return out


def pages(n: int) -> list[tuple[str, float]]:
    from starlette.testclient import TestClient

    from fsm_engine.ui import create_app
    from fsm_engine.ui.actions import Console
    db = os.path.join(tempfile.mkdtemp(prefix="fsm-console-"), "viewer.db")
    build(db, n)
    eng = Engine(db, llm=None)
    store = eng.store  # as `fsm ui --write` serves: the engine's one connection
    token = "bench-console-token"
    client = TestClient(create_app(store, token=token, console=Console(eng)),
                        headers={"Authorization": f"Bearer {token}"})
    some = store.query(InstanceFilter(), limit=1)[0].id

    def get(url: str):  # type: ignore[no-untyped-def]
        def go() -> None:
            r = client.get(url)
            assert r.status_code == 200, (url, r.status_code, r.text[:300])
        return go
    cases = [("instance page with actions", get(f"/instances/{some}")),
             ("confirm: pause one", get(f"/console/instances/{some}/pause")),
             ("confirm: bulk cancel report+failed", get(
                 "/console/bulk/cancel?machine=report&status=failed")),
             ("confirm: bulk pause, no filter", get("/console/bulk/pause")),
             ("list page with bulk links", get("/"))]
    try:
        return [(name, timed(fn, 5)) for name, fn in cases]
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--pages-n", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-pages", action="store_true")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="fsm-bulk-")
    backends = [("SQLite", os.path.join(folder, "bulk.db"))]
    cluster = None
    if not args.no_postgres:
        from fsm_engine.testing.postgres import PostgresCluster
        cluster = PostgresCluster().start()
        backends.append(("PostgreSQL", cluster.database()))
    try:
        print(f"\nbulk actions on {args.n} instances, batches of {args.batch}\n")
        print(f"| {'backend':<10} | {'action':<8} | {'instances/s':>11} | {'changed':>7} |")
        print(f"|{'-' * 12}|{'-' * 10}|{'-' * 13}|{'-' * 9}|")
        for name, url in backends:
            for action, rate, changed in bulk_rates(url, args.n, args.batch):
                print(f"| {name:<10} | {action:<8} | {rate:11,.0f} | {changed:7} |", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    if not args.no_pages:
        print(f"\nconsole pages at {args.pages_n} instances, median of 5\n")
        print(f"| {'page':<36} | {'ms':>7} |\n|{'-' * 38}|{'-' * 9}|")
        for name, ms in pages(args.pages_n):
            print(f"| {name:<36} | {ms:7.1f} |", flush=True)


if __name__ == "__main__":
    main()
