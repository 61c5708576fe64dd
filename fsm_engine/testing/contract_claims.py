"""Contract cases for claims (mixed into ``StoreContract``): which instances a worker
takes (runnable, unowned or from dead owners, oldest first, within its limit), the
recovery row a takeover records, ``held`` and ``release``, and concurrent claimers
that never share an instance (see ``contract_leases`` for renewals and takeovers).
"""

from __future__ import annotations

from ..runtime.fleet.adoption import claim_request
from ..store import HistoryRow, StepCommit, Store, WorkerRow
from .contract_fixtures import concurrently, live, moved, record


class ClaimContract:
    """``claim`` / ``held`` / ``release`` / ``wait_for_work`` / ``next_due``."""

    def test_claim_takes_runnable_unowned_instances_oldest_first(self, store: Store) -> None:
        store.create(record("a"), record("b", status="running"), record("c", status="waiting"),
                     record("d", status="completed"), record("e", status="cancelled"))
        later = record("f", status="running")
        later.next_attempt_at = 2000.0  # in a retry backoff until then
        store.create(later)
        live(store, "w1", "w2")
        got = store.claim(claim_request("w1", now=1500.0, limit=10))
        assert [(r.id, r.owner, r.status, r.version) for r in got] == \
            [("a", "w1", "running", 1), ("b", "w1", "running", 1)]
        assert [store.get(i) for i in ("a", "b")] == got
        assert store.claim(claim_request("w2", now=1500.0)) == []  # nothing left for others
        assert [r.id for r in store.claim(claim_request("w2", now=2000.0))] == ["f"]  # now due

    def test_claim_honours_the_limit(self, store: Store) -> None:
        store.create(*[record(f"i{n}") for n in range(5)])
        live(store, "w1", "w2")
        first = store.claim(claim_request("w1", now=1.0, limit=2))
        second = store.claim(claim_request("w2", now=1.0, limit=10))
        assert [r.id for r in first] == ["i0", "i1"]
        assert [r.id for r in second] == ["i2", "i3", "i4"]

    def test_claim_skips_live_leases_and_takes_expired_ones(self, store: Store) -> None:
        now = 5000.0
        store.put_worker(WorkerRow("live", "h", 1, "1", 0.0, now - 1, lease_until=now + 5))
        store.put_worker(WorkerRow("expired", "h", 2, "2", 0.0, now - 9, lease_until=now - 1))
        store.put_worker(WorkerRow("old-row", "h", 3, "3", 0.0, now - 20))  # no lease_until
        store.create(record("held", status="running", owner="live"),
                     record("orphan", status="running", owner="expired"),
                     record("old", status="running", owner="old-row"),
                     record("ghost", status="pending", owner="no-such-worker"))
        live(store, "me")
        got = store.claim(claim_request("me", now=now, lease_seconds=10.0))
        assert [r.id for r in got] == ["orphan", "old", "ghost"]
        assert store.get("held").owner == "live"
        taken = store.claim(claim_request("other", now=now, dead=["live"]))
        assert [r.id for r in taken] == ["held"]

    def test_claim_counts_a_recovery_from_a_dead_owner_mid_step(self, store: Store) -> None:
        store.put_worker(WorkerRow("dead", "h", 1, "1", 0.0, 100.0, lease_until=110.0))
        mid = record("mid", status="running", owner="dead")
        asleep = record("asleep", status="running", owner="dead")
        asleep.next_attempt_at = 105.0  # its retry was due after the owner's last heartbeat
        fresh = record("fresh", status="pending")
        store.create(mid, asleep, fresh)
        got = {r.id: r for r in store.claim(claim_request("me", now=200.0, due_by=float("inf")))}
        # the takeover's history row is seq 1, and it is no progress: recovered_seq is past it
        assert (got["mid"].recoveries, got["mid"].seq, got["mid"].recovered_seq) == (1, 1, 1)
        assert got["asleep"].recoveries == 0 and got["fresh"].recoveries == 0
        assert store.get("mid") == got["mid"]
        assert [h.kind for h in store.history("mid")] == ["recovery"]
        assert [h.kind for h in store.history("asleep")] == ["recovery"]
        assert store.history("fresh") == []  # nobody held it: nothing to record

    def test_claim_records_a_takeover_as_a_recovery_row(self, store: Store) -> None:
        now = 5000.0
        store.put_worker(WorkerRow("hostA:41:aa", "hostA", 41, "9", 0.0, now - 9,
                                   lease_until=now - 1))
        store.put_worker(WorkerRow("hostA:42:bb", "hostA", 42, "9", 0.0, now - 1,
                                   lease_until=now + 5))
        expired, gone = record("exp", status="running", owner="hostA:41:aa"), record(
            "gone", status="running", owner="hostA:42:bb")
        expired.seq = gone.seq = 0
        ghost = record("ghost", status="pending", owner="no-such-worker")
        mine, free = record("mine", status="running", owner="hostB:7:cc"), record("free")
        store.create(expired, gone, ghost, mine, free)
        live(store, "hostB:7:cc")
        got = store.claim(claim_request("hostB:7:cc", now=now, own=True, dead=["hostA:42:bb"]))
        assert [r.id for r in got] == ["exp", "gone", "ghost", "mine", "free"]
        assert store.history("mine") == [] and store.history("free") == []  # no takeover
        rows = {iid: store.history(iid) for iid in ("exp", "gone", "ghost")}
        assert all(len(r) == 1 for r in rows.values())
        row = rows["exp"][0]
        assert (row.seq, row.kind, row.trigger, row.source, row.dest, row.tokens, row.delta,
                row.at) == (1, "recovery", "recovery", "start", "start", 0, {}, now)
        assert row.detail["recovery"] == {
            "from": "hostA:41:aa", "from_host": "hostA", "from_pid": 41, "to": "hostB:7:cc",
            "to_host": "hostB", "to_pid": 7, "cause": "lease_expired", "status": "running",
            "mid_step": True, "last_heartbeat": now - 9, "recoveries": 1}
        assert rows["gone"][0].detail["recovery"]["cause"] == "process_gone"
        info = rows["ghost"][0].detail["recovery"]
        assert (info["cause"], info["status"], info["mid_step"], info["from_host"],
                info["last_heartbeat"], info["recoveries"]) == (
                    "deregistered", "pending", False, None, None, 0)
        assert store.get("ghost").recoveries == 0  # never started: not a crash recovery
        assert store.check() == []  # seq gap-free, state equals the last row's dest

    def test_recovery_rows_are_not_progress(self, store: Store) -> None:
        """Takeovers without a committed step in between keep counting; a step resets."""
        store.create(record("i", status="running", owner="w0"))
        for n in (1, 2):
            rec = store.claim(claim_request(f"w{n}", now=100.0 * n))[0]
            assert (rec.seq, rec.recoveries, rec.recovered_seq) == (n, n, n)
        step = moved(rec, "next")
        assert store.commit([StepCommit(step, rec.version, history=[HistoryRow(
            "i", step.seq, "start", "next", "go", 250.0)], before=rec)]) == [True]
        rec = store.claim(claim_request("w3", now=300.0))[0]
        assert (rec.seq, rec.recoveries, rec.recovered_seq) == (4, 1, 4)
        assert [h.kind for h in store.history("i")] == [
            "recovery", "recovery", "transition", "recovery"]
        assert [h.seq for h in store.history("i")] == [1, 2, 3, 4]
        assert store.check() == []

    def test_claim_own_and_machines_filters(self, store: Store) -> None:
        live(store, "me")
        store.create(record("mine", owner="me"), record("x", machine="other"), record("y"))
        assert [r.id for r in store.claim(claim_request("me", now=200.0, machines=["m"]))] == ["y"]
        assert store.claim(claim_request("me", now=200.0, machines=[])) == []
        assert [r.id for r in store.claim(claim_request("me", now=200.0, own=True,
                                                       machines=["m"]))] == ["mine", "y"]

    def test_held_and_release(self, store: Store) -> None:
        store.create(record("a"), record("b"), record("c"))
        live(store, "w1", "w2")
        got = store.claim(claim_request("w1", now=1.0))
        assert store.held("w1") == {"a": "running", "b": "running", "c": "running"}
        assert store.release("w1", ["a", "nope"], now=1.5) == 1
        assert store.release("w2", now=1.5) == 0 and store.release("w1", [], now=1.5) == 0
        assert store.held("w1") == {"b": "running", "c": "running"}
        stale = StepCommit(moved(got[0], "next"), got[0].version)
        assert store.commit([stale]) == [False]  # a release fences the old owner's writes
        assert store.get("a").owner is None and store.get("a").version == 2
        assert store.get("a").updated_at == 1.5  # the releaser's clock, not the wall's
        assert store.release("w1", now=1.5) == 2 and store.held("w1") == {}
        assert [r.id for r in store.claim(claim_request("w2", now=2.0))] == ["a", "b", "c"]

    def test_wait_for_work_returns_within_its_timeout(self, store: Store) -> None:
        store.wait_for_work(0.05)  # nothing happens: it returns anyway

    def test_next_due_is_the_earliest_timer_or_delayed_start_still_to_come(
            self, store: Store) -> None:
        assert store.next_due(0.0) is None  # an empty store
        rows = []
        for iid, status, due, machine in [("w1", "waiting", 1300.0, "m"),
                                          ("w2", "waiting", 1100.0, "m"),
                                          ("s1", "scheduled", 1200.0, "m"),
                                          ("o1", "scheduled", 1050.0, "other"),
                                          ("p1", "pending", 1010.0, "m"),
                                          ("d1", "completed", 1020.0, "m")]:
            rows.append(record(iid, status=status, machine=machine))  # type: ignore[arg-type]
            rows[-1].next_attempt_at = due
        store.create(*rows)
        assert store.next_due(1000.0) == 1050.0  # neither a pending nor a final one
        assert store.next_due(1000.0, ["m"]) == 1100.0
        assert store.next_due(1100.0, ["m"]) == 1200.0  # after ``now``, not at it
        assert store.next_due(1250.0, ["m", "other"]) == 1300.0
        assert store.next_due(1300.0) is None and store.next_due(1000.0, []) is None

    def test_concurrent_claimers_never_share_an_instance(self, store: Store, reopen) -> None:
        store.create(*[record(f"i{n:03}") for n in range(120)])
        live(store, "w0", "w1", "w2", "w3")
        others = [reopen() for _ in range(3)]
        taken: dict[str, list[str]] = {}

        def claim_all(n: int, s: Store) -> None:
            name = f"w{n}"
            mine = taken.setdefault(name, [])
            while True:
                got = s.claim(claim_request(name, now=1.0, limit=7))
                if not got:
                    return
                mine.extend(r.id for r in got)
        concurrently(claim_all, store, others)
        every = [i for ids in taken.values() for i in ids]
        assert sorted(every) == [f"i{n:03}" for n in range(120)]  # each exactly once
        owners = {r.id: r.owner for r in store.list()}
        assert all(owners[i] == name for name, ids in taken.items() for i in ids)
