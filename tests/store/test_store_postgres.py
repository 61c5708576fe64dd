"""PostgreSQL-specific read side: what ``check`` can see without ``integrity_check``
(invalid indexes, ``amcheck`` when installed) and read-only opening; batched ``steps``
on both backends."""

from __future__ import annotations

import time
import uuid

import pytest

from fsm_engine import StoreError
from fsm_engine.runtime.fleet.adoption import claim_request
from fsm_engine.store import InstanceFilter, open_store
from fsm_engine.testing.contract import fleet


def test_check_runs_amcheck_and_reports_an_invalid_index(pg_cluster) -> None:  # noqa: ANN001
    import psycopg  # the [postgres] extra (pg_cluster skipped without it)
    name = "amck_" + uuid.uuid4().hex[:8]
    pg_cluster.sql(f"CREATE DATABASE {name}")
    pg_cluster.sql("CREATE EXTENSION amcheck", dbname=name)
    store = open_store(pg_cluster.url(name))
    try:
        fleet(store)
        assert store.check() == []  # bt_index_check over every index: clean
        with pytest.raises(psycopg.Error):  # four m1 rows: the build fails, the index stays
            pg_cluster.sql("CREATE UNIQUE INDEX CONCURRENTLY idx_broken ON instances (machine)",
                           dbname=name)
        assert store.check() == ["index idx_broken is invalid (rebuild it with REINDEX)"]
    finally:
        store.close()


def test_read_only_open_refuses_an_older_schema_and_changes_nothing(pg_cluster) -> None:  # noqa: ANN001
    url = pg_cluster.database()
    with pytest.raises(StoreError, match="no fsm database"):
        open_store(url, readonly=True)
    open_store(url).close()
    schema = url.rsplit("%3D", 1)[1]
    pg_cluster.sql(f"UPDATE {schema}.fsm_meta SET value = '3' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 3.*read-only"):
        open_store(url, readonly=True)
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta") == [("3",)]


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_steps_in_small_batches_are_the_same_rows(store_url: str, batch: int) -> None:
    store = open_store(store_url)
    try:
        fleet(store)
        every = list(store.steps(InstanceFilter()))
        assert len(every) == 7
        assert list(store.steps(InstanceFilter(), batch=batch)) == every  # type: ignore[call-arg]
    finally:
        store.close()


# -- a takeover and a renewal of the same lease, both orders forced ---------------------------
def _lease_race(url: str) -> tuple:
    from fsm_engine.testing.contract import live, record
    from fsm_engine.testing.contract_leases import _worker
    store, other = open_store(url), open_store(url)
    old = _worker("old", 100.0, 110.0)
    store.put_worker(old)
    store.create(record("i", status="running", owner="old"))
    live(store, "new")
    return store, other, old


def test_a_renewal_that_commits_first_keeps_the_instance(pg_cluster, monkeypatch) -> None:  # noqa: ANN001
    """The claim has read the owner as expired and holds its candidates when the renewal
    (by a clock that says the lease holds) commits: the claim's end of the lease finds
    the renewed row, and it takes nothing."""
    from fsm_engine.testing.contract_leases import _renewed, in_thread, pause_claim
    store, other, old = _lease_race(pg_cluster.database())
    try:
        reached, go = pause_claim(monkeypatch, after_ending=False)
        claimer, took = in_thread(lambda: store.claim(claim_request("new", now=111.0)))
        assert reached.wait(60)
        assert other.renew_worker(_renewed(old, 109.0), 109.0) is True  # the row is not locked
        go.set()
        claimer.join()
        assert took["value"] == [] and store.get("i").owner == "old"
        assert {w.id: w.lease_until for w in store.workers()}["old"] == 119.0
    finally:
        store.close()
        other.close()


def test_a_renewal_waiting_on_a_takeover_is_refused_once_it_commits(pg_cluster,  # noqa: ANN001
                                                                    monkeypatch) -> None:
    """The claim has ended the lease (the worker row is locked by its UPDATE) when the
    renewal comes: the renewal waits on the row lock (seen in ``pg_stat_activity``), then
    re-checks its WHERE on the ended row (EvalPlanQual) and updates nothing."""
    import psycopg

    from fsm_engine.testing.contract_leases import _renewed, in_thread, pause_claim
    url = pg_cluster.database()
    store, other, old = _lease_race(url)
    try:
        reached, go = pause_claim(monkeypatch, after_ending=True)
        claimer, took = in_thread(lambda: store.claim(claim_request("new", now=111.0)))
        assert reached.wait(60)
        renewer, renewed = in_thread(lambda: other.renew_worker(_renewed(old, 109.0), 109.0))
        with psycopg.connect(url, autocommit=True) as watch:
            for _ in range(3000):  # poll (10 ms) until the renewal waits on the row lock
                if watch.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = "
                                 "'Lock' AND query LIKE 'UPDATE workers SET heartbeat_at%'"
                                 ).fetchall():
                    break
                time.sleep(0.01)
            else:
                pytest.fail("the renewal never waited on the takeover's row lock")
        go.set()
        claimer.join()
        renewer.join()
        assert [r.id for r in took["value"]] == ["i"] and renewed["value"] is False
        assert store.get("i").owner == "new"
    finally:
        store.close()
        other.close()


def test_a_workers_batch_is_one_statement_and_the_rest_take_the_general_path(
        pg_cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Owned instances, one step each: one statement (``pg_commit``), which says what
    applied; a batch it does not fit (an instance twice, a hand-off) commits as before."""
    from fsm_engine.store import StepCommit, pg_commit
    from fsm_engine.store.postgres import PostgresStore
    from fsm_engine.testing.contract import hist, live, moved, record
    store = open_store(pg_cluster.database())
    ran: list[object] = []
    plain = PostgresStore._commit_plain
    monkeypatch.setattr(PostgresStore, "_commit_plain",
                        lambda self, *a: ran.append(plain(self, *a)) or ran[-1])
    try:
        live(store, "w1")
        store.create(*(record(i, status="running", owner="w1") for i in "abc"))
        steps = [StepCommit(moved(store.get(i), "x"), 5 if i == "b" else 0,
                            history=[hist(i, 1, "start", "x")]) for i in "abc"]
        assert pg_commit.plain(steps)
        assert store.commit(steps) == [True, False, True] and ran == [[True, False, True]]
        a = store.get("a")
        twice = [StepCommit(moved(a, "y"), 1), StepCommit(moved(a, "z"), 1)]
        back = [StepCommit(moved(store.get("c"), "y", owner=None), 1)]
        assert not pg_commit.plain(twice) and not pg_commit.plain(back)
        assert store.commit(twice) == [True, False] and store.commit(back) == [True]
        assert len(ran) == 1
    finally:
        store.close()


def test_a_batchs_stream_rows_take_their_instances_locks_in_one_order(pg_cluster) -> None:  # noqa: ANN001
    """A batch whose plain step and whose family step both carry stream rows writes them
    once, after both, under the instances' advisory locks in sorted order (as every stream
    batch takes them), so it never holds one instance's lock while waiting for another's
    that sorts first: a stream batch taking them in order cannot deadlock with it."""
    import threading

    import psycopg

    from fsm_engine.store import StepCommit
    from fsm_engine.store.postgres.streams import LOCK_SPACE
    from fsm_engine.store.streams import StreamOp, StreamRow
    from fsm_engine.testing.contract import hist, live, moved, record
    url = pg_cluster.database()
    store = open_store(url)
    live(store, "w1")
    store.create(*(record(i, status="running", owner="w1") for i in "abc"))

    def op(iid: str) -> StreamOp:
        return StreamOp(iid, (StreamRow(iid, 1, 0, "chunk", f"{iid}!", 0, {}, 1.0),), True, 1, 1)
    plain = StepCommit(moved(store.get("b"), "x"), 0, history=[hist("b", 1, "start", "x")],
                       stream=(op("b"),))
    family = StepCommit(moved(store.get("a"), "x"), 0, history=[hist("a", 1, "start", "x")],
                        fence=[("c", store.get("c").version)], stream=(op("a"),))
    with psycopg.connect(url, autocommit=True) as blocker:
        blocker.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LOCK_SPACE, "a"))
        out: list[object] = []
        t = threading.Thread(target=lambda: out.append(store.commit([plain, family])))
        t.start()
        deadline = time.monotonic() + 30
        while not blocker.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                  "AND NOT granted").fetchone()[0]:  # (a poll) the commit waits
            assert time.monotonic() < deadline, "the commit never waited for the lock"
            time.sleep(0.01)
        free = blocker.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                               (LOCK_SPACE, "b")).fetchone()[0]
        blocker.execute("SELECT pg_advisory_unlock_all()")
        t.join(30)
    try:
        assert free, "the commit held b's stream lock while waiting for a's"
        assert out == [[True, True]]
        assert [r.text for i in "ab" for r in store.stream_read(i) if r.kind == "chunk"] == [
            "a!", "b!"]
    finally:
        store.close()


def test_an_unreachable_server_reads_as_one_line_of_sentences() -> None:
    from fsm_engine.testing.postgres import free_port
    with pytest.raises(StoreError) as err:  # libpq's message has two lines: kept apart
        open_store(f"postgresql://fsm@127.0.0.1:{free_port()}/fsm")
    message = str(err.value)
    assert "\n" not in message and "Connection refused; Is the server running" in message
