"""Many `fsm worker` processes on one store: real PostgreSQL, real SIGKILL / SIGSTOP, a
restarted server, SQLite shared by processes, and bad store URLs.

The kill-and-pause and restart tests run at the issue's counts (4 workers x 2,000
instances; 1,000 through a restart: ~50-60 s and ~40 s on 2 shared cores);
``FSM_SCALE_N`` / ``FSM_RESTART_N`` scale them.  Every property is asserted on
every run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from scale_harness import (
    FSM,
    ROOT,
    Fleet,
    audit,
    check_books,
    completed,
    enqueue,
    final,
    install_audit,
    leases_granted,
    wait_until,
)

from fsm_engine.store import open_store

pytestmark = pytest.mark.timeout(300)

LEASE = 3.0  # generous: CI shares 2 cores, and a starved worker rightly loses its lease


@pytest.fixture(autouse=True)
def _machines_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(ROOT))


def _pid(worker_id: str) -> int:
    return int(worker_id.split(":")[1])


@pytest.mark.slow
def test_four_workers_survive_a_kill_and_a_pause(pg_cluster, tmp_path: Path, sink,
                                                 fleets) -> None:
    """4 workers, one SIGKILLed, one SIGSTOPped for 3 lease periods: every instance completes,
    each step once, each delivery key once, never two live leases, nothing committed by the
    paused worker after it lost an instance."""
    url = pg_cluster.database()
    open_store(url).close()
    install_audit(url)
    n = int(os.environ.get("FSM_SCALE_N", "2000"))
    ids = enqueue(url, n)
    fleet = Fleet(url, tmp_path, sink, lease=LEASE, concurrency=40)
    fleets.append(fleet)
    fleet.spawn(4)
    store = open_store(url)
    try:
        wait_until(lambda: completed(store) >= n // 5, 120, "a fifth of the instances")
        killed, paused = fleet.procs[0], fleet.procs[1]
        killed.send_signal(signal.SIGKILL)
        wait_until(lambda: completed(store) >= 2 * n // 5, 120, "two fifths")
        paused.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(3 * LEASE)  # the scenario: paused for three lease periods
        paused.send_signal(signal.SIGCONT)
        wait_until(lambda: final(store) == n, 240, "every instance to end")
        codes = fleet.stop()
        assert codes[0] == -signal.SIGKILL and codes[1:] == [0, 0, 0], [fleet.log(i) for i in range(4)]
        books = check_books(store, ids, sink)
        keys = {r.id: r.key for r in store.list()}
    finally:
        store.close()
    owners = audit(url, "audit_owner")
    history = audit(url, "audit_history")
    # every step committed exactly once (no rolled-back extras), and each change of hands
    # from one worker to another is one recovery row written with it, naming both
    assert len(history) == n * 7 + len(books["takeovers"])
    by_key = {key: iid for iid, key in keys.items()}
    handed = Counter((by_key[o["instance"]], o["old_owner"], o["new_owner"]) for o in owners
                     if o["old_owner"] is not None)
    assert handed == Counter(books["takeovers"]) and handed  # the kill forced takeovers
    # never two live leases: an instance changes hands only from nobody, from an owner whose
    # lease had run out, or from the SIGKILLed worker (dead: its pid is gone)
    killed_ids = {o["old_owner"] for o in owners
                  if o["old_owner"] and _pid(o["old_owner"]) == killed.pid}
    for o in owners:
        if o["old_owner"] is None or o["old_owner"] in killed_ids:
            continue
        assert o["old_lease"] is None or o["old_lease"] < o["at"], o
    # ... and as every heartbeat wrote it: no lease the old owner was ever granted (before
    # the takeover, or by a renewal racing it) reached past the moment it was taken over
    granted = leases_granted(url)
    for o in owners:
        if o["old_owner"] is not None and o["old_owner"] not in killed_ids:
            assert granted.get(o["old_owner"], 0.0) < o["at"], (o, granted.get(o["old_owner"]))
    # the paused worker lost instances, and committed nothing to any of them afterwards
    paused_app = f"fsm_engine:{paused.pid}"
    # (each time another worker took one from it; a takeover by its own new id, after it
    # lost its lease and registered again, is not a loss)
    taken = [(o["instance"], o["at"]) for o in owners
             if o["old_owner"] and _pid(o["old_owner"]) == paused.pid and o["at"] > stopped_at
             and _pid(o["new_owner"]) != paused.pid]
    assert taken, "the paused worker held nothing when it was stopped"
    # ... until it claimed one back (a takeover of its own, whose row is legitimate)
    late = []
    for i, at in taken:
        back = min([o["at"] for o in owners if o["instance"] == i and o["at"] > at
                    and _pid(o["new_owner"] or "") == paused.pid], default=float("inf"))
        late += [h for h in history if h["app"] == paused_app and h["instance"] == i
                 and at < h["at"] < back]
    assert late == []
    # repeats of a delivery (same key) only for instances in flight on the killed/paused workers
    assert books["repeats"] <= 2 * 40
    assert len(keys) == n


@pytest.mark.slow
def test_workers_survive_a_postgres_restart(pg_cluster, tmp_path: Path, sink, fleets) -> None:
    """``pg_ctl restart -m fast`` under 4 running workers: all complete, no gap or repeat."""
    url = pg_cluster.database()
    n = int(os.environ.get("FSM_RESTART_N", "1000"))
    ids = enqueue(url, n)
    fleet = Fleet(url, tmp_path, sink, lease=LEASE, concurrency=40)
    fleets.append(fleet)
    fleet.spawn(4)
    probe = open_store(url)
    try:
        wait_until(lambda: completed(probe) >= n // 4, 120, "a quarter of the instances")
    finally:
        probe.close()
    pg_cluster.restart()
    store = open_store(url)
    try:
        wait_until(lambda: final(store) == n, 240, "every instance after the restart")
        codes = fleet.stop()
        assert codes == [0, 0, 0, 0], [fleet.log(i)[-2000:] for i in range(4)]
        check_books(store, ids, sink)
    finally:
        store.close()
    assert any("store" in fleet.log(i) for i in range(4))  # they did see it go away


@pytest.mark.slow
def test_three_workers_share_one_sqlite_file(tmp_path: Path, sink, fleets) -> None:
    """3 worker processes on one SQLite file, one SIGKILLed: all complete, each step once,
    "database is locked" never reaches anyone."""
    url = str(tmp_path / "fsm.db")
    n = int(os.environ.get("FSM_SQLITE_N", "150"))
    ids = enqueue(url, n)
    fleet = Fleet(url, tmp_path, sink, lease=LEASE, concurrency=30)
    fleets.append(fleet)
    fleet.spawn(3)
    store = open_store(url)
    try:
        wait_until(lambda: completed(store) >= n // 4, 120, "a quarter of the instances")
        fleet.procs[0].send_signal(signal.SIGKILL)
        wait_until(lambda: final(store) == n, 240, "every instance")
        codes = fleet.stop()
        assert codes == [-signal.SIGKILL, 0, 0], [fleet.log(i)[-2000:] for i in range(3)]
        check_books(store, ids, sink)
    finally:
        store.close()
    for i in range(3):
        assert "locked" not in fleet.log(i)


def test_start_then_wait_on_a_worker(pg_cluster, tmp_path: Path, sink, fleets) -> None:
    """`fsm start` prints ids, `fsm workers` lists the worker, `fsm wait` exits 0."""
    url = pg_cluster.database()
    env = dict(os.environ, FSM_DB=url)
    lic = "/usr/share/common-licenses"
    started = subprocess.run([FSM, "start", "machines/moderation.py", "--input",
                              f"{lic}/Apache-2.0", f"{lic}/GPL-3"], env=env, cwd=ROOT,
                             capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    ids = started.stdout.split()
    assert len(ids) == 2
    timed_out = subprocess.run([FSM, "wait", *ids, "--timeout", "0.3", "-q"], env=env,
                               capture_output=True, text=True)
    assert timed_out.returncode == 3 and "timed out" in timed_out.stderr
    fleet = Fleet(url, tmp_path, sink, lease=LEASE)
    fleets.append(fleet)
    fleet.spawn(1)
    try:
        done = subprocess.run([FSM, "wait", *ids, "--timeout", "60", "--json"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        listed = subprocess.run([FSM, "workers", "--json"], env=env, capture_output=True,
                                text=True)
        assert listed.returncode == 0 and f'"pid": {fleet.procs[0].pid}' in listed.stdout
    finally:
        assert fleet.stop() == [0]


def test_an_unloadable_machine_is_left_alone_with_a_reason(pg_cluster, tmp_path: Path,
                                                           sink, fleets) -> None:
    """A worker that cannot import an instance's machine leaves it pending and says why."""
    url = pg_cluster.database()
    [iid] = enqueue(url, 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fleet = Fleet(url, tmp_path, sink, lease=LEASE)
    fleets.append(fleet)
    fleet.env["FSM_MACHINES_ROOT"] = str(elsewhere)  # a host without the machine's code
    fleet.procs.append(subprocess.Popen(fleet.argv, env=fleet.env, cwd=elsewhere,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    store = open_store(url)
    try:
        wait_until(lambda: store.get(iid).reason == "machine_unavailable", 60, "the reason")
        rec = store.get(iid)
        assert rec.status in ("pending", "running") and store.history(iid) == []
        assert "machines/moderation.py" in (rec.last_error or "")
        shown = subprocess.run([FSM, "show", iid, "--db", url], capture_output=True, text=True)
        assert "machine_unavailable" in shown.stdout
        assert fleet.stop() == [0]
        able = Fleet(url, tmp_path, sink, lease=LEASE)  # a host that has it takes it on
        fleets.append(able)
        able.spawn(1)
        wait_until(lambda: store.get(iid).status == "completed", 60, "completion elsewhere")
        assert able.stop() == [0]
        assert store.get(iid).reason is None
    finally:
        store.close()


@pytest.mark.parametrize("case", ["unreachable", "password", "foreign", "newer", "privilege"])
def test_bad_postgres_urls_are_one_line_exit_2(pg_cluster, case: str) -> None:
    """Unreachable, wrong password, another application's database, a newer schema: one
    ``fsm: error:`` line, exit 2, nothing written."""
    from fsm_engine.testing.postgres import free_port
    url = pg_cluster.database()
    schema = url.rsplit("%3D", 1)[1]
    if case == "unreachable":
        url = f"postgresql://postgres:x@127.0.0.1:{free_port()}/postgres"
    elif case == "password":
        url = url.replace("fsm-test-password", "wrong")
    elif case == "foreign":
        pg_cluster.sql(f"CREATE TABLE {schema}.customers (id INT PRIMARY KEY, name TEXT)")
    elif case == "newer":
        open_store(url).close()
        pg_cluster.sql(f"UPDATE {schema}.fsm_meta SET value='99' WHERE key='schema_version'")
    else:  # a role that may use the schema but not its tables (made by another role)
        open_store(url).close()
        role = "r" + schema
        pg_cluster.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")
        pg_cluster.sql(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
        url = url.replace("postgres:fsm-test-password@", f"{role}:pw-{role}@")
    before = pg_cluster.sql(f"SELECT table_name FROM information_schema.tables "
                            f"WHERE table_schema = '{schema}' ORDER BY 1")
    lic = "/usr/share/common-licenses/GPL-3"
    commands = [["start", "machines/moderation.py", "--input", lic, "--db", url],
                ["list", "--db", url]]
    if case == "unreachable":
        commands += [["run", "machines/moderation.py", "--input", lic, "--db", url],
                     ["worker", "--db", url]]
    for argv in commands:
        got = subprocess.run([FSM, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert got.returncode == 2, (argv, got.stdout, got.stderr)
        lines = got.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fsm: error: "), (argv, got.stderr)
        assert "Traceback" not in got.stderr and "wrong" not in got.stderr  # no password
    after = pg_cluster.sql(f"SELECT table_name FROM information_schema.tables "
                           f"WHERE table_schema = '{schema}' ORDER BY 1")
    assert after == before
    expect = {"unreachable": "cannot connect", "password": "password authentication failed",
              "foreign": "not an fsm database", "newer": "upgrade fsm_engine",
              "privilege": "permission denied"}[case]
    assert expect in got.stderr


def test_listen_notify_wakes_a_waiting_worker(pg_cluster) -> None:
    """``wait_for_work`` returns when another connection creates an instance."""
    import threading

    from fsm_engine.testing.contract import record
    url = pg_cluster.database()
    waiter, writer = open_store(url), open_store(url)
    woke = threading.Event()
    waiter.wait_for_work(0.01)  # LISTEN is set up before anything is created

    def wait() -> None:
        waiter.wait_for_work(60)
        woke.set()
    thread = threading.Thread(target=wait)
    thread.start()
    writer.create(record("new"))
    assert woke.wait(30)
    thread.join()
    waiter.close()
    writer.close()


