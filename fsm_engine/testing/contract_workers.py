"""Contract cases for worker rows (mixed into ``StoreContract``): registered, renewed,
listed and removed, their lease and queues kept.
"""

from __future__ import annotations

from dataclasses import replace

from ..store import Store, WorkerRow


class WorkerContract:
    """``put_worker`` / ``workers`` / ``delete_worker`` round-trip every field."""

    def test_workers_put_list_update_delete(self, store: Store) -> None:
        w1 = WorkerRow(id="w1", host="h", pid=10, pid_start="123", started_at=1.0,
                       heartbeat_at=2.0)
        w2 = WorkerRow(id="w2", host="h2", pid=11, pid_start="456", started_at=1.5,
                       heartbeat_at=2.5)
        store.put_worker(w1)
        store.put_worker(w2)
        assert sorted(store.workers(), key=lambda w: w.id) == [w1, w2]
        store.put_worker(replace(w1, heartbeat_at=9.0))
        assert {w.id: w.heartbeat_at for w in store.workers()} == {"w1": 9.0, "w2": 2.5}
        store.delete_worker("w1")
        store.delete_worker("never-registered")
        assert store.workers() == [w2]

    def test_worker_lease_and_queues_round_trip(self, store: Store) -> None:
        w = WorkerRow(id="w", host="h", pid=1, pid_start="9", started_at=1.0, heartbeat_at=2.0,
                      lease_until=7.0, queues=["llm", "io"])
        store.put_worker(w)
        assert store.workers() == [w]
