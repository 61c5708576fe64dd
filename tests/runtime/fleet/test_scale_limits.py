"""Queues, partitions and shared rate limits with real `fsm worker` processes on PostgreSQL.

Scaled down from the issue to keep CI short (each test prints what it measured):
the `llm` queue is saturated by 5 s scripted calls (the issue says 30 s; what is
shown — io steps flowing while every llm slot is busy — does not depend on the
length); the rate-limit window is 2 s (``window:2``; the default is 60 s).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scale_harness import MODERATION, Fleet, inputs, wait_until

from fsm_engine import Engine
from fsm_engine.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TENANT = "tests/helpers/tenant_machine.py"


class Sampler:
    """Reads the store every ``every`` seconds in a thread of its own while a test runs."""

    def __init__(self, url: str, sql: str, every: float = 0.02) -> None:
        import psycopg
        self.rows: list[tuple[float, list[tuple[Any, ...]]]] = []
        self._conn = psycopg.connect(url, autocommit=True)
        self._stop = threading.Event()
        self._sql = sql
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.rows.append((time.time(), self._conn.execute(self._sql).fetchall()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


LEASED = ("SELECT {col}, count(*) FROM instances WHERE owner IS NOT NULL "
          "AND status IN ('pending', 'running') GROUP BY {col}")


def _enqueue(url: str, n: int, ref: str = MODERATION, **kw: Any) -> list[str]:
    engine = Engine(url)
    try:
        return engine.start_many(ref, inputs(n), enqueue=True, **kw)
    finally:
        engine.close()


def _at(store: Any, iid: str, source: str) -> float | None:
    """When ``iid`` left ``source`` (its history row's time), None while it has not."""
    return next((h.at for h in store.history(iid) if h.source == source), None)


def test_io_steps_flow_while_the_llm_queue_is_saturated(pg_cluster, tmp_path: Path, sink,
                                                        fleets) -> None:
    url = pg_cluster.database()
    fleet = Fleet(url, tmp_path, sink, lease=3.0, concurrency=16, delay_s=5.0,
                  args=["--concurrency", "llm=2", "--queue-limit", "llm=3"])
    fleets.append(fleet)
    fleet.spawn(2)
    store = open_store(url)
    sampler = Sampler(url, LEASED.format(col="queue"))
    try:
        slow = _enqueue(url, 3)  # fill every llm slot of the fleet (3 over both workers)
        wait_until(lambda: all(_at(store, i, "preprocess") for i in slow), 60, "llm saturated")
        saturated = max(_at(store, i, "preprocess") for i in slow)
        fast = _enqueue(url, 12)
        created = {r.id: r.created_at for r in store.list() if r.id in set(fast)}
        wait_until(lambda: all(_at(store, i, "collect") for i in fast), 60, "io steps")
        io_done = {i: _at(store, i, "collect") for i in fast}
        first_llm_end = min(filter(None, (_at(store, i, "infer") for i in slow)), default=None)
    finally:
        sampler.stop()
        store.close()
    latency = sorted(io_done[i] - created[i] for i in fast)
    # every io step of the new instances committed while all llm slots were still busy
    assert first_llm_end is None or max(io_done.values()) < first_llm_end, \
        (io_done, first_llm_end)
    llm_peak = max((n for _, rows in sampler.rows for q, n in rows if q == "llm"), default=0)
    assert llm_peak <= 3  # the queue's global limit, over both workers
    margin = ("no llm call had ended yet" if first_llm_end is None else
              f"{first_llm_end - max(io_done.values()):.1f}s before the first llm call ended")
    print(f"\nio latency (start -> collect committed) p50 "
          f"{statistics.median(latency) * 1000:.0f} ms, max {latency[-1] * 1000:.0f} ms over "
          f"{len(fast)} instances, all done {max(io_done.values()) - saturated:.1f}s after every "
          f"llm slot was taken ({margin}); llm leases peak {llm_peak} (limit 3), "
          f"{len(sampler.rows)} samples")
    assert fleet.stop() == [0, 0]


def test_a_partition_limit_holds_and_the_small_tenant_is_not_starved(pg_cluster,
                                                                      tmp_path: Path, sink,
                                                                      fleets) -> None:
    url = pg_cluster.database()
    fleet = Fleet(url, tmp_path, sink, lease=3.0, concurrency=16, delay_s=0.005,
                  args=["--partition-limit", "2"])
    fleets.append(fleet)
    big = _enqueue(url, 500, TENANT, partition="big")  # all queued before the small tenant's
    small = _enqueue(url, 10, TENANT, partition="small")
    sampler = Sampler(url, LEASED.format(col="partition_key"))
    start = time.time()
    store = open_store(url)
    fleet.spawn(2)
    try:
        def done(ids: list[str]) -> Callable[[], bool]:
            wanted = set(ids)
            return lambda: sum(1 for r in store.list(statuses=["completed"])
                               if r.id in wanted) == len(ids)
        wait_until(done(small), 120, "the small tenant")
        small_end = time.time()
        big_left = len([r for r in store.list() if r.id in set(big) and not r.final])
        wait_until(done(big), 180, "the big tenant", interval=0.5)
        big_end = time.time()
    finally:
        sampler.stop()
        store.close()
    peaks: dict[str, int] = {}
    for _, rows in sampler.rows:
        for key, n in rows:
            peaks[key] = max(peaks.get(key, 0), n)
    assert peaks.get("big", 0) <= 2 and peaks.get("small", 0) <= 2, peaks
    assert peaks.get("big") == 2  # the limit was reached, not merely never approached
    assert big_left > 400  # the small tenant was done while most of the big one waited
    print(f"\nsmall tenant (10) done in {small_end - start:.1f}s with {big_left} of 500 big "
          f"left; big done in {big_end - start:.1f}s; leased peaks {peaks} "
          f"({len(sampler.rows)} samples)")
    assert fleet.stop() == [0, 0]


def test_ten_workers_never_pass_a_shared_tokens_per_window_limit(pg_cluster, tmp_path: Path,
                                                                  sink, fleets) -> None:
    url = pg_cluster.database()
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "rated.jsonl"
    script.write_text(json.dumps({"text": "ok", "prompt_tokens": 10, "completion_tokens": 50,
                                  "delay_s": 0.05}) + "\n")
    tpm, window = 600, 2.0  # 600 tokens per 2 s: ten 60-token calls
    fleet = Fleet(url, tmp_path, sink, lease=5.0, concurrency=8, llm=f"scripted:{script}",
                  args=["--rate-limit", f"default=tpm:{tpm},window:{window}"],
                  env={"FSM_SCRIPTED_LOG": str(log)})
    fleets.append(fleet)
    fleet.spawn(10)
    engine = Engine(url)
    try:
        ids = engine.start_many("tests/helpers/rate_machine.py", [{"n": n} for n in range(40)], enqueue=True)
    finally:
        engine.close()
    store = open_store(url)
    try:
        wait_until(lambda: len(store.list(statuses=["completed"])) == 40, 120, "all calls")
        records = store.list()
        attempts = sum(len(store.attempts(i)) for i in ids)
    finally:
        store.close()
    calls = sorted((json.loads(line) for line in log.read_text().splitlines()),
                   key=lambda c: c["start"])
    assert sorted(c["input"]["n"] for c in calls) == list(range(40))  # one call each
    worst = max(sum(c["tokens"] for c in calls if s["start"] <= c["start"] < s["start"] + window)
                for s in calls)
    assert worst <= tpm, worst
    assert attempts == 0 and {r.attempt for r in records} == {1}  # no attempt spent waiting
    waited = [r for r in records if r.last_error and "rate limit" in r.last_error]
    assert waited  # the limit made instances wait (durably: released, claimed again)
    span = calls[-1]["start"] - calls[0]["start"]
    print(f"\n{len(calls)} calls (40 instances) by {len({c['pid'] for c in calls})} workers in {span:.1f}s; "
          f"busiest {window:g}s window {worst} tokens (limit {tpm}); "
          f"{len(waited)} instances waited for the limit")
    assert fleet.stop() == [0] * 10


def test_workers_without_flags_obey_the_stored_limits_and_follow_a_change(
        pg_cluster, tmp_path: Path, sink, fleets) -> None:
    """`fsm limits` once for the fleet: two workers started with no limit flags keep one
    llm lease at a time; raised to 3 while they run, they use more within a refresh."""
    url = pg_cluster.database()
    open_store(url).close()
    assert _fsm_limits(url, "--queue-limit", "llm=1") == {"queue_limits": {"llm": 1}}
    fleet = Fleet(url, tmp_path, sink, lease=3.0, concurrency=16, delay_s=0.4)
    fleets.append(fleet)
    fleet.spawn(2)
    store = open_store(url)
    sampler = Sampler(url, LEASED.format(col="queue"))
    try:
        ids = _enqueue(url, 16)
        wait_until(lambda: sum(1 for i in ids if _at(store, i, "infer")) >= 4, 90,
                   "four model calls under the limit of 1")
        changed = time.time()
        assert _fsm_limits(url, "--queue-limit", "llm=3") == {"queue_limits": {"llm": 3}}
        wait_until(lambda: completed_of(store, ids) == len(ids), 120, "every instance")
    finally:
        sampler.stop()
        store.close()
    before = [n for at, rows in sampler.rows if at < changed for q, n in rows if q == "llm"]
    after = [n for at, rows in sampler.rows if at > changed for q, n in rows if q == "llm"]
    assert before and max(before) == 1  # two workers, 32 slots, one llm lease at a time
    assert max(after) <= 3 and max(after) >= 2, after  # the new limit, read while running
    assert fleet.stop() == [0, 0]
    print(f"\nllm leases peak {max(before)} under the stored limit 1, {max(after)} after it "
          f"was raised to 3 ({len(sampler.rows)} samples)")


def completed_of(store: Any, ids: list[str]) -> int:
    wanted = set(ids)
    return sum(1 for r in store.list(statuses=["completed"]) if r.id in wanted)


def _fsm_limits(url: str, *args: str) -> dict[str, Any]:
    import subprocess

    from scale_harness import FSM, ROOT
    done = subprocess.run([FSM, "limits", "--db", url, *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
