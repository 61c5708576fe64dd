"""Queues, partitions and rate limits: the part of the ``Store`` contract that workers
sharing limits rely on (mixed into ``StoreContract``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..runtime.fleet.adoption import claim_request
from ..store import StepCommit, Store
from ..store.rates import RateRequest


def _rec(iid: str, queue: str = "default", partition: str | None = None, **kw: Any) -> Any:
    from .contract_fixtures import record
    rec = record(iid, **kw)
    rec.queue, rec.partition_key = queue, partition
    return rec


def _rate(key: str, now: float, tokens: int, *, rpm: int | None = None,
          tpm: int | None = 100, window: float = 10.0) -> RateRequest:
    return RateRequest("p:m", key, now, tokens, rpm, tpm, window, 5.0)


class QueueContract:
    """Claims by queue under global limits, per partition fairly, and rate windows."""

    def test_queue_and_partition_round_trip_and_queue_moves_with_a_step(self,
                                                                       store: Store) -> None:
        from .contract_fixtures import moved
        store.create(_rec("a", "io", "tenant-a"))
        rec = store.get("a")
        assert (rec.queue, rec.partition_key) == ("io", "tenant-a")
        new = moved(rec, "infer", queue="llm")
        assert store.commit([StepCommit(new, rec.version, before=rec)]) == [True]
        assert (store.get("a").queue, store.get("a").partition_key) == ("llm", "tenant-a")

    def test_claim_by_queue_and_skipping_queues(self, store: Store) -> None:
        from .contract_fixtures import live
        store.create(_rec("a", "io"), _rec("b", "llm"), _rec("c"), _rec("d", "llm"))
        live(store, "w1")
        got = store.claim(claim_request("w1", now=1.0, queues=["llm"]))
        assert [r.id for r in got] == ["b", "d"]
        rest = store.claim(claim_request("w1", now=1.0, skip_queues=["io"]))
        assert [r.id for r in rest] == ["c"]
        assert store.claim(claim_request("w1", now=1.0, queues=[])) == []

    def test_a_global_queue_limit_counts_live_leases_of_every_worker(self,
                                                                    store: Store) -> None:
        from ..store.records import WorkerRow
        from .contract_fixtures import live
        store.create(*[_rec(f"i{n}", "llm") for n in range(6)], _rec("x", "io"))
        live(store, "w1", "w2")
        store.put_worker(WorkerRow("gone", "h", 1, "1", 0.0, 0.0, lease_until=0.5))

        def take(owner: str, limit: int = 10) -> list[str]:
            return [r.id for r in store.claim(claim_request(
                owner, now=1.0, limit=limit, queues=["llm"], queue_limit=3))]
        assert take("w1", 2) == ["i0", "i1"]
        assert take("w2") == ["i2"]  # 3 live leases of llm now, whoever holds them
        assert take("w2") == []
        store.release("w1", ["i0"], now=1.0)
        assert take("w2") == ["i0"]
        # an expired lease does not count: its instance is claimable and frees its slot
        gone = store.get("i2")
        gone.owner = "gone"
        assert store.commit([StepCommit(gone, gone.version)]) == [True]
        assert take("w1") == ["i2"] and take("w1") == []

    def test_a_partition_limit_holds_and_shares_slots_fairly(self, store: Store) -> None:
        from .contract_fixtures import live
        store.create(*[_rec(f"big{n:02}", partition="big") for n in range(20)],
                     *[_rec(f"small{n}", partition="small") for n in range(3)],
                     _rec("free1"), _rec("free2"))
        live(store, "w1", "w2")
        got = store.claim(claim_request("w1", now=1.0, limit=10, partition_limit=2))
        by = sorted(r.id for r in got)
        # 2 of each key (the limit) and the unkeyed ones, although "big" is older
        assert by == ["big00", "big01", "free1", "free2", "small0", "small1"]
        assert store.claim(claim_request("w2", now=1.0, limit=10, partition_limit=2)) == []
        store.release("w1", ["big00"], now=1.0)
        again = store.claim(claim_request("w2", now=1.0, limit=10, partition_limit=2))
        assert [r.id for r in again] == ["big00"]

    def test_partition_slots_go_to_the_least_loaded_key_first(self, store: Store) -> None:
        from .contract_fixtures import live
        store.create(*[_rec(f"big{n:02}", partition="big") for n in range(10)],
                     *[_rec(f"small{n}", partition="small") for n in range(3)])
        live(store, "w1")
        first = store.claim(claim_request("w1", now=1.0, limit=1, partition_limit=3))
        second = store.claim(claim_request("w1", now=1.0, limit=1, partition_limit=3))
        # "big" is older, so it goes first; then "small", which holds nothing yet
        assert [r.id for r in first + second] == ["big00", "small0"]

    def test_concurrent_claimers_keep_the_queue_and_partition_limits(self, store: Store,
                                                                     reopen: Callable[[], Store]
                                                                     ) -> None:
        from .contract_fixtures import concurrently, live
        store.create(*[_rec(f"i{n:03}", "llm", f"t{n % 3}") for n in range(60)])
        live(store, "w0", "w1", "w2", "w3")
        others = [reopen() for _ in range(3)]
        taken: list[str] = []
        lock = threading.Lock()

        def claim(n: int, s: Store) -> None:
            for _ in range(5):
                got = s.claim(claim_request(f"w{n}", now=1.0, limit=4, queues=["llm"],
                                           queue_limit=5, partition_limit=2))
                with lock:
                    taken.extend(r.id for r in got)
        concurrently(claim, store, others)
        held = [r for r in store.list() if r.owner is not None]
        assert len(taken) == len(held) == len(set(taken)) == 5  # the queue's limit
        per_key: dict[str | None, int] = {}
        for r in held:
            per_key[r.partition_key] = per_key.get(r.partition_key, 0) + 1
        assert max(per_key.values()) <= 2 and len(per_key) == 3

    def test_rate_window_admits_within_limits_then_says_how_long_to_wait(self,
                                                                         store: Store) -> None:
        assert store.rate_acquire(_rate("a", 100.0, 60)) == (0.0, "")
        assert store.rate_acquire(_rate("b", 101.0, 30)) == (0.0, "")
        wait, what = store.rate_acquire(_rate("c", 102.0, 30))
        assert what == "tokens" and wait == 10.0  # a still runs: it counts a window at least
        store.rate_settle("p:m", "a", 20, 103.0)  # a billed 20 tokens, counts until 103
        assert store.rate_acquire(_rate("c", 102.0, 30)) == (0.0, "")  # 20 + 30 + 30 <= 100
        wait, _ = store.rate_acquire(_rate("d", 102.5, 40))
        assert wait == 0.5  # once a stops counting (103) there is room
        assert store.rate_acquire(_rate("d", 103.0, 40)) == (0.0, "")
        other = RateRequest("q:m", "a", 102.0, 100, None, 100, 10.0, 5.0)
        assert store.rate_acquire(other) == (0.0, "")  # limits are independent by name
        store.rate_settle("p:m", "no-such-call", 5, 200.0)  # ignored

    def test_rate_window_counts_requests(self, store: Store) -> None:
        assert store.rate_acquire(_rate("a", 1.0, 1, rpm=2, tpm=None)) == (0.0, "")
        assert store.rate_acquire(_rate("b", 1.0, 1, rpm=2, tpm=None)) == (0.0, "")
        wait, what = store.rate_acquire(_rate("c", 2.0, 1, rpm=2, tpm=None))
        assert what == "requests" and wait > 0

    def test_concurrent_admissions_never_pass_the_limit(self, store: Store,
                                                        reopen: Callable[[], Store]) -> None:
        from .contract_fixtures import concurrently
        others = [reopen() for _ in range(3)]
        admitted: list[int] = []
        lock = threading.Lock()

        def ask(n: int, s: Store) -> None:
            for k in range(10):
                wait, _ = s.rate_acquire(_rate(f"{n}-{k}", 1.0, 7, tpm=100))
                if wait == 0.0:
                    with lock:
                        admitted.append(7)
        concurrently(ask, store, others)
        assert sum(admitted) == 98  # 14 calls of 7 tokens: never more than 100

    def test_fleet_limits_round_trip_replace_and_clear(self, store: Store) -> None:
        assert store.get_limits() is None
        limits = {"queue_limits": {"llm": 8}, "partition_limit": 2,
                  "rate_limits": {"*": {"rpm": 5, "tpm": None, "window_s": 60.0,
                                        "hold_s": 300.0}}}
        store.put_limits(limits)
        assert store.get_limits() == limits
        store.put_limits({"queue_limits": {"io": 3}})  # replaces, never merges
        assert store.get_limits() == {"queue_limits": {"io": 3}}
        store.put_limits(None)
        assert store.get_limits() is None
        store.put_limits({})
        assert store.get_limits() is None
