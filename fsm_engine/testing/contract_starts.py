"""Contract cases for how instances start (format 14, issue 38; mixed into
``StoreContract``): start keys unique per machine (``create`` refuses a second,
``by_start_key`` finds the first), ``scheduled`` instances claimed only once due,
debounced starts folding into one scheduled instance (``debounce``) and a step refused
(``StepRejected``) when it would schedule a second burst of a key, and every claim in
priority-then-age order (``rank``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..errors import StartKeyTaken, StepRejected
from ..runtime.fleet.adoption import claim_request
from ..store import StepCommit, Store
from ..store.records import AGING_S, SCHEDULED, InstanceRecord
from .contract_fixtures import concurrently, hist, live, moved, record


def keyed(iid: str, key: str, *, machine: str = "m") -> InstanceRecord:
    """A new record started with the start key ``key``."""
    rec = record(iid, machine=machine)
    rec.start_key = key
    return rec


def scheduled(iid: str, due: float, *, at: float = 1000.0) -> InstanceRecord:
    """A new record created at ``at``, scheduled to start at ``due``."""
    rec = record(iid, at=at)
    rec.status, rec.next_attempt_at = SCHEDULED, due
    return rec


def burst(iid: str, n: int, at: float, *, window: float = 30.0,
          until: float | None = None) -> InstanceRecord:
    """A debounced start of key ``k`` at ``at`` with input ``{"n": n}``."""
    rec = scheduled(iid, at + window, at=at)
    rec.context, rec.input = {"n": n}, {"n": n}
    rec.debounce_key, rec.debounce_until = "k", until
    return rec


class StartContract:
    """``create`` with start keys, ``by_start_key``, ``debounce``, ``by_debounce_key``,
    scheduled and priority claims."""

    def test_a_start_key_is_unique_per_machine(self, store: Store) -> None:
        store.create(keyed("a", "order-42"))
        twin, other = keyed("b", "order-42"), record("c")
        with pytest.raises(StartKeyTaken) as info:
            store.create(other, twin)
        assert (info.value.machine, info.value.key) == ("m", "order-42")
        assert (other.key, twin.key) == (None, None)  # nothing of the batch stored
        assert [r.id for r in store.list()] == ["a"]
        store.create(keyed("d", "order-42", machine="m2"), record("e"), record("f"))
        found = store.by_start_key("m", "order-42")
        assert found is not None and found == store.get("a")
        assert store.by_start_key("m", "order-43") is None
        assert store.by_start_key("m2", "order-42").id == "d"  # type: ignore[union-attr]

    def test_concurrent_keyed_creates_store_one(self, store: Store, reopen) -> None:
        others = [reopen() for _ in range(3)]
        won: list[str] = []

        def start(n: int, s: Store) -> None:
            for _ in range(5):
                try:
                    s.create(keyed(f"i{n}-{_}", "once"))
                    won.append(f"i{n}-{_}")
                except StartKeyTaken:
                    pass
        concurrently(start, store, others)
        assert len(won) == 1 and [r.id for r in store.list()] == won

    def test_a_scheduled_instance_is_claimed_once_due(self, store: Store) -> None:
        store.create(scheduled("later", 2000.0), record("now"))
        live(store, "w1")
        first = store.claim(claim_request("w1", now=1500.0, due_by=float("inf"), limit=10))
        assert [r.id for r in first] == ["now"]  # not even a resume starts it early
        [due] = store.claim(claim_request("w1", now=2000.0, limit=10))
        assert (due.id, due.status, due.owner, due.next_attempt_at) == \
            ("later", "running", "w1", None)
        assert store.get("later") == due

    def test_claims_take_higher_priority_first_then_age(self, store: Store) -> None:
        plain, urgent, aged = record("plain", at=1000.0), record("urgent", at=1000.0 + AGING_S), \
            record("aged", at=900.0)
        urgent.priority = 2  # rank 1000 + 60 - 120 = 940: after "aged" (900), before "plain"
        store.create(plain, urgent, aged)
        assert (plain.rank, urgent.rank, aged.rank) == (1000.0, 940.0, 900.0)
        live(store, "w1")
        got = store.claim(claim_request("w1", now=5000.0, limit=2))
        assert [r.id for r in got] == ["aged", "urgent"]
        assert [r.id for r in store.claim(claim_request("w1", now=5000.0))] == ["plain"]

    def test_priority_orders_claims_within_partitions(self, store: Store) -> None:
        recs = [record(f"{p}{n}", at=1000.0 + n) for p in "ab" for n in range(2)]
        for rec in recs:
            rec.partition_key = rec.id[0]
        recs[1].priority = 5  # a1 ahead of a0
        store.create(*recs)
        got = store.claim(claim_request("w1", now=5000.0, limit=2, partition_limit=1))
        assert sorted(r.id for r in got) == ["a1", "b0"]

    def test_debounced_starts_fold_into_one_scheduled_instance(self, store: Store) -> None:
        assert store.debounce(burst("first", 1, 1000.0, until=1050.0)) == "first"
        assert store.debounce(burst("second", 2, 1010.0)) == "first"
        rec = store.get("first")
        assert (rec.status, rec.input, rec.context, rec.next_attempt_at) == \
            (SCHEDULED, {"n": 2}, {"n": 2}, 1040.0)  # the latest input, due pushed back
        assert store.debounce(burst("third", 3, 1030.0)) == "first"
        assert store.get("first").next_attempt_at == 1050.0  # never past the max wait
        assert [r.id for r in store.list()] == ["first"]
        [claimed] = store.claim(claim_request("w1", now=1050.0))
        assert claimed.id == "first" and claimed.context == {"n": 3}
        assert store.debounce(burst("next", 4, 1060.0)) == "next"  # a new burst
        assert [r.id for r in store.list()] == ["first", "next"]

    def test_by_debounce_key_finds_the_scheduled_instance_of_the_key(self, store: Store) -> None:
        assert store.by_debounce_key("m", "k") is None
        store.debounce(burst("first", 1, 1000.0))
        assert store.by_debounce_key("m", "k") == store.get("first")
        assert store.by_debounce_key("m2", "k") is None
        assert store.by_debounce_key("m", "other") is None
        store.claim(claim_request("w1", now=5000.0))  # started: no longer the burst's
        assert store.by_debounce_key("m", "k") is None

    def test_concurrent_debounced_starts_make_one_instance(self, store: Store, reopen) -> None:
        others = [reopen() for _ in range(3)]
        held: set[str] = set()

        def start(n: int, s: Store) -> None:
            for i in range(5):
                held.add(s.debounce(burst(f"i{n}-{i}", n * 10 + i, 1000.0 + i)))
        concurrently(start, store, others)
        assert len(held) == 1 and [r.id for r in store.list()] == list(held)
        assert store.get(held.pop()).status == SCHEDULED

    def test_a_step_scheduling_a_second_burst_of_a_key_is_rejected_by_index(
            self, store: Store) -> None:
        """A step making an instance ``scheduled`` while another holds its debounce key's
        burst (a restart racing a new burst past ``Engine.restart``'s read) is refused by
        the partial unique index: ``StepRejected`` naming the step (``index``) and the
        key's column, nothing of the batch written, the holder untouched."""
        old = burst("old", 1, 1000.0)
        old.status, old.next_attempt_at = "cancelled", None
        store.create(old, record("b"))
        assert store.debounce(burst("new", 2, 1100.0)) == "new"
        before, holder = store.get("old"), store.get("new")
        fine = StepCommit(moved(store.get("b"), "x"), 0, history=[hist("b", 1, "start", "x")])
        again = StepCommit(replace(before, status=SCHEDULED, next_attempt_at=1200.0, seq=1,
                                   updated_at=1101.0), before.version,
                           history=[hist("old", 1, "start", "start", kind="restart")])
        with pytest.raises(StepRejected) as err:
            store.commit([fine, again])
        assert (err.value.index, err.value.instance_id) == (1, "old")
        assert "debounce_key" in str(err.value) and "\n" not in str(err.value)
        assert store.get("old") == before and store.history("old") == []
        assert store.get("new") == holder and store.get("b").state == "start"
        assert store.commit([fine]) == [True]  # the rest of the batch goes again
