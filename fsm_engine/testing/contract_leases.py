"""Leases: a renewal only while the lease holds, and a takeover that ends it for good
(the part of the ``Store`` contract ``runtime.fleet.ownership`` relies on; mixed into
``StoreContract``; see ``store.leases``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from ..runtime.fleet.adoption import claim_request
from ..store import ClaimRequest, Store, WorkerRow, claims


def _worker(wid: str, beat: float, until: float | None, **kw: Any) -> WorkerRow:
    return WorkerRow(wid, "h", 1, "1", 0.0, beat, lease_until=until, **kw)


def _renewed(w: WorkerRow, now: float, lease: float = 10.0) -> WorkerRow:
    return replace(w, heartbeat_at=now, lease_until=now + lease)


def pause_claim(monkeypatch: pytest.MonkeyPatch, *, after_ending: bool
                ) -> tuple[threading.Event, threading.Event]:
    """Hold every claim that has candidates inside its transaction: ``(reached, go)``;
    ``reached`` is set when it has picked its candidates (and, ``after_ending``, ended
    the leases of the owners it takes from), and it goes on once ``go`` is set."""
    reached, go = threading.Event(), threading.Event()
    real = claims.takeable

    def held(req: ClaimRequest, found: Any, txn: Any) -> Any:
        kept = real(req, found, txn) if after_ending else None
        reached.set()
        assert go.wait(60), "the test never let the claim go on"
        return kept if after_ending else real(req, found, txn)
    monkeypatch.setattr(claims, "takeable", held)
    return reached, go


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``fn()`` started in a thread; its result lands in ``out["value"]``."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.__setitem__("value", fn()))
    thread.start()
    return thread, out


class LeaseContract:
    """``renew_worker`` refuses an expired or ended lease; a takeover ends it for good."""

    def test_a_live_lease_is_renewed_and_an_expired_one_is_not(self, store: Store) -> None:
        w = _worker("w", 100.0, 110.0, queues=["llm"])
        store.put_worker(w)
        fresh = replace(_renewed(w, 105.0), queues=["io"])
        assert store.renew_worker(fresh, 105.0) is True
        assert store.workers() == [fresh]
        assert store.renew_worker(_renewed(w, 115.0), 115.0) is True  # the last instant
        late = _renewed(w, 125.5)
        assert store.renew_worker(late, 125.5) is False  # ran out at 125
        assert store.workers()[0].lease_until == 125.0  # nothing written
        assert store.renew_worker(_renewed(_worker("never", 0.0, None), 105.0), 105.0) is False
        assert [x.id for x in store.workers()] == ["w"]  # a renewal registers nobody

    def test_a_takeover_ends_the_lease_for_good(self, store: Store) -> None:
        from .contract_fixtures import live, record
        old = _worker("old", 100.0, 110.0)
        store.put_worker(old)
        store.create(record("i", status="running", owner="old"))
        live(store, "new")
        assert [r.id for r in store.claim(claim_request("new", now=111.0))] == ["i"]
        row = {w.id: w for w in store.workers()}["old"]
        assert row.lease_until == row.heartbeat_at == 100.0  # ended at its last heartbeat
        # refused even by a renewer whose clock lags (it still thinks the lease holds)
        assert store.renew_worker(_renewed(old, 109.0), 109.0) is False
        assert store.get("i").owner == "new"
        assert store.claim(claim_request("old", now=112.0, own=True)) == []

    def test_a_claim_of_unowned_or_own_instances_touches_no_worker_row(self, store: Store
                                                                      ) -> None:
        from .contract_fixtures import record
        me, other = _worker("me", 100.0, 110.0), _worker("other", 100.0, 110.0)
        store.put_worker(me)
        store.put_worker(other)
        store.create(record("free"), record("mine", owner="me"),
                     record("ghost", owner="no-row"), record("dead", owner="other"))
        got = store.claim(claim_request("me", now=105.0, own=True, dead=["other"]))
        assert sorted(r.id for r in got) == ["dead", "free", "ghost", "mine"]
        assert sorted(store.workers(), key=lambda w: w.id) == [me, other]  # no lease ended

    def test_fence_leaves_its_own_process_and_workers_without_sessions_alone(
            self, store: Store) -> None:
        """This process's worker row has a lease that ran out long ago (and another's names
        no session): ``fence`` ends none of this process's sessions, and the store goes on
        working."""
        import os

        from ..process import pid_start
        from .contract_fixtures import record
        store.create(*[record(f"i{n}") for n in range(3)])
        store.put_worker(WorkerRow("me", "h", os.getpid(), pid_start(os.getpid()), 0.0, 100.0,
                                   lease_until=110.0))
        store.put_worker(_worker("gone", 100.0, 110.0))
        assert store.fence(1e12, 10.0) == 0
        assert [r.id for r in store.list()] == ["i0", "i1", "i2"]
        assert sorted(w.id for w in store.workers()) == ["gone", "me"]

    def test_end_lease_ends_an_expired_lease_only(self, store: Store) -> None:
        live_w, late_w = _worker("live", 190.0, 200.0), _worker("late", 100.0, 110.0)
        store.put_worker(live_w)
        store.put_worker(late_w)
        assert store.end_lease("live", 150.0, 10.0) is False
        assert store.renew_worker(_renewed(live_w, 150.0), 150.0) is True
        assert store.end_lease("late", 150.0, 10.0) is True
        assert store.renew_worker(_renewed(late_w, 105.0), 105.0) is False  # ended for good
        assert store.end_lease("late", 151.0, 10.0) is True  # over stays over
        assert store.end_lease("never", 150.0, 10.0) is True  # no row: nothing holds

    def test_a_renewal_during_a_takeover_that_ended_the_lease_is_refused(
            self, store: Store, reopen: Callable[[], Store],
            monkeypatch: pytest.MonkeyPatch) -> None:
        """The claim has ended the lease and is still in its transaction when the renewal
        comes (from another connection, by a clock that says the lease holds): the
        renewal waits for the claim and is refused; the claim takes the instance."""
        from .contract_fixtures import live, record
        old = _worker("old", 100.0, 110.0)
        store.put_worker(old)
        store.create(record("i", status="running", owner="old"))
        live(store, "new")
        other = reopen()
        try:
            reached, go = pause_claim(monkeypatch, after_ending=True)
            claimer, took = in_thread(lambda: store.claim(claim_request("new", now=111.0)))
            assert reached.wait(60)
            renewer, renewed = in_thread(lambda: other.renew_worker(_renewed(old, 109.0), 109.0))
            go.set()
            claimer.join()
            renewer.join()
        finally:
            other.close()
        assert [r.id for r in took["value"]] == ["i"] and renewed["value"] is False
        assert store.get("i").owner == "new"
        row = {w.id: w for w in store.workers()}["old"]
        assert row.lease_until == row.heartbeat_at  # ended, and it stayed ended
