"""The PostgreSQL group commit alone: client and server CPU per committed step.

    python bench/pg_commit.py [--n 2000] [--batch 30]

``n`` instances with the reference machine's context (a license text of
2,400 characters after preprocess, a verdict, a result) each take seven steps,
committed in batches of ``batch`` steps through ``PostgresStore.commit``, three
ways: the one-statement batch (``store/pg_commit.py``), the statement-per-row
path it replaced (``PostgresStore.commit`` with the one-statement path off), and
the floor: the one statement with its arrays built in advance, so only psycopg
and the server work (what any client of this schema pays for the same rows).
Client CPU is this process's; server CPU is the backends' (``/proc``).  Prints
µs per step; the ratios are what to compare (the machine is shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "tests" / "helpers")]

from scale_out import server_cpu, spent  # noqa: E402

from fsm_engine.store import open_store, pg_commit  # noqa: E402
from fsm_engine.store.codec import encode_step  # noqa: E402
from fsm_engine.store.records import HistoryRow, InstanceRecord, StepCommit  # noqa: E402
from fsm_engine.testing.postgres import PostgresCluster  # noqa: E402

TEXT = Path("/usr/share/common-licenses/GPL-3").read_text()[:2400]
#: The context fields each of the seven steps sets (after the first, which reads the file).
UPDATES: list[dict[str, Any]] = [
    {"text": TEXT * 8}, {"text": TEXT, "truncated": True},
    {"raw": '{"decision": "approve", "categories": [], "summary": "fine"}',
     "finish_reason": "stop", "infer_attempts": 1},
    {"verdict": {"decision": "approve", "categories": [], "summary": "fine"},
     "verdict_source": "model"},
    {"result": {"file": "GPL-3", "source": "model", "decision": "approve"}},
    {"delivery": {"status": 200}}, {}]


def records(store: Any, n: int) -> list[InstanceRecord]:
    now = time.time()
    recs = [InstanceRecord(id=uuid.uuid4().hex, machine="moderation", module="m.py",
                           fingerprint="f", state="init", status="running", context={"path": "x"},
                           input={"path": "x"}, max_transitions=100, token_budget=None, owner="w",
                           created_at=now, updated_at=now, seq=0, version=0) for _ in range(n)]
    store.create(*recs)
    return recs


def step(rec: InstanceRecord, i: int) -> StepCommit:
    before = dataclasses.replace(rec)
    before.context = dict(rec.context)
    rec.context = {**rec.context, **UPDATES[i]}
    rec.state, rec.seq, rec.loop_count = f"s{i}", rec.seq + 1, rec.loop_count + 1
    rec.updated_at = time.time()
    row = HistoryRow(instance_id=rec.id, seq=rec.seq, source=before.state, dest=rec.state,
                     trigger="next", at=rec.updated_at, delta=UPDATES[i], guards=[["ok", True]],
                     duration_ms=1.5, tokens=0)
    return StepCommit(record=rec, expected_version=rec.version, history=[row], before=before)


def run(cluster: PostgresCluster, n: int, batch: int, prepare: Callable[[Any, list[StepCommit]], Any],
        execute: Callable[[Any, Any], None]) -> tuple[float, float]:
    """Client and server µs per step: ``prepare(store, steps)`` is not timed,
    ``execute(store, prepared)`` is."""
    store = open_store(cluster.database())
    try:
        recs = records(store, n)
        client = server = 0.0
        for i in range(len(UPDATES)):
            for j in range(0, n, batch):
                steps = [step(r, i) for r in recs[j:j + batch]]
                ready = prepare(store, steps)
                s0, c0 = server_cpu(cluster), time.process_time()
                execute(store, ready)
                client += time.process_time() - c0
                server += spent(s0, server_cpu(cluster))
                for s in steps:
                    s.record.version = s.expected_version + 1
    finally:
        store.close()
    total = n * len(UPDATES)
    return client / total * 1e6, server / total * 1e6


def fsm(store: Any, steps: list[StepCommit]) -> None:
    assert all(store.commit(steps))


def per_row(store: Any, steps: list[StepCommit]) -> None:
    plain, pg_commit.plain = pg_commit.plain, lambda _steps: False
    try:
        assert all(store.commit(steps))
    finally:
        pg_commit.plain = plain


def arrays(store: Any, steps: list[StepCommit]) -> list[Any]:
    batch = pg_commit.Batch()
    for i, s in enumerate(steps):
        batch.add(i, s, encode_step(i, s), store.blob_threshold, store._shrink)
    return batch.params()


def floor(store: Any, params: list[Any]) -> None:
    conn, generation = store._take()
    try:
        with psycopg.RawCursor(conn) as cur:
            assert cur.execute(pg_commit.statement(), params).fetchall()
    finally:
        store._give(conn, generation)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=30)
    args = ap.parse_args()
    keep = lambda _store, steps: steps  # noqa: E731
    with PostgresCluster() as cluster:
        for name, prepare, execute in (
                ("a statement per row (before)", keep, per_row),
                ("one statement (after)", keep, fsm),
                ("one statement, arrays built beforehand (floor)", arrays, floor)):
            client, server = run(cluster, args.n, args.batch, prepare, execute)
            print(f"{name}: client {client:.0f} µs, server {server:.0f} µs per step "
                  f"(batches of {args.batch})", flush=True)


if __name__ == "__main__":
    main()
