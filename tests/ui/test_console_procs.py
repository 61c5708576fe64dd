"""The operator's writes against real processes (issue 25): a pause during a long step
of an `fsm worker`, the paused instance surviving the worker's SIGKILL and a restart
unclaimed; a bulk cancel of 2,000 by query SIGKILLed mid-way; `fsm send`, `fsm pause`
and `fsm unpause` from the command line.  SQLite files; the bulk also on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import ROOT
from procs import wait_until

from fsm_engine import Engine, load_machine
from fsm_engine.store import InstanceFilter, open_store

MODULE = "tests/helpers/console_machine.py"
FSM = [sys.executable, "-m", "fsm_engine.cli"]


def _env(tmp_path: Path, db: str) -> dict[str, str]:
    return {**os.environ, "FSM_DB": db, "PYTHONPATH": str(ROOT), "FSM_MACHINES_ROOT": str(ROOT),
            "CONSOLE_GATE": str(tmp_path / "gate"), "CONSOLE_LOG": str(tmp_path / "log")}


def _fsm(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*FSM, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _worker(env: dict[str, str], tmp_path: Path, n: int) -> subprocess.Popen[bytes]:
    log = open(tmp_path / f"worker{n}.log", "wb")  # noqa: SIM115 - the process keeps it
    return subprocess.Popen([*FSM, "worker", "--lease", "2", "--poll", "0.05"], env=env,
                            cwd=ROOT, stdout=log, stderr=log)


def _log(tmp_path: Path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def test_pause_mid_step_in_a_worker_survives_sigkill_and_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    env = _env(tmp_path, db)
    (tmp_path / "in.json").write_text(json.dumps({"n": 0}))
    iid = _fsm("start", MODULE, "--input", str(tmp_path / "in.json"), env=env).stdout.strip()
    store = open_store(db)
    worker = _worker(env, tmp_path, 0)
    try:
        wait_until(lambda: _log(tmp_path) == ["slow 0"], 60, "the long step to start")
        asked = _fsm("pause", iid, "--as", "ann", "--why", "provider outage", env=env)
        assert "pause requested" in asked.stdout  # the worker holds it mid-step
        (tmp_path / "gate").write_text("")  # the long step ends
        wait_until(lambda: store.get(iid).status == "paused", 60, "the pause to apply")
        rows = store.history(iid)
        assert [(h.kind, h.source, h.dest) for h in rows] == [
            ("transition", "slow", "quick"), ("pause", "quick", "quick")]
        assert rows[1].detail["operator"] == "ann" and rows[1].reason == "provider outage"
        assert store.get(iid).context["n"] == 1  # the step's commit landed

        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        worker = _worker(env, tmp_path, 1)
        (tmp_path / "canary.json").write_text(json.dumps({"n": 100}))
        canary = _fsm("start", MODULE, "--input", str(tmp_path / "canary.json"),
                      env=env).stdout.strip()
        wait_until(lambda: store.get(canary).status == "completed", 60,
                   "the restarted worker to finish other work")
        rec = store.get(iid)
        assert (rec.status, rec.owner, rec.state) == ("paused", None, "quick")
        assert "quick 101" in _log(tmp_path)  # the canary ran
        assert "quick 1" not in _log(tmp_path)  # the paused one's next step never started
        listed = _fsm("list", "--status", "paused", "--json", env=env).stdout
        assert [r["id"] for r in json.loads(listed)] == [iid]

        _fsm("unpause", iid, "--as", "bob", env=env)
        wait_until(lambda: store.get(iid).status == "completed", 60, "the unpaused run")
        assert store.get(iid).context["n"] == 11
        kinds = [h.kind for h in store.history(iid)]
        assert kinds == ["transition", "pause", "unpause", "transition"]
        assert store.history(iid)[2].detail["operator"] == "bob"
    finally:
        worker.kill()
        worker.wait(10)
        store.close()


def _fill(url: str, n: int) -> list[str]:
    machine, _ = load_machine(str(ROOT / MODULE))
    eng = Engine(url, llm=None)
    try:
        return eng.start_many(machine, [{"n": i} for i in range(n)], enqueue=True)
    finally:
        eng.close()


def _cancels(store: Any, ids: list[str]) -> Counter[str]:
    return Counter(h.instance_id for i in ids for h in store.history(i) if h.kind == "cancel")


def test_bulk_cancel_of_2000_survives_a_sigkill_mid_way(tmp_path: Path, store_url: str) -> None:
    ids = _fill(store_url, 2000)
    env = {**_env(tmp_path, store_url)}
    store = open_store(store_url)
    try:
        dry = _fsm("cancel", "--machine", "console", env=env)
        assert "2000 instance(s) match" in dry.stdout
        assert store.count(InstanceFilter(statuses=("cancelled",))).get(None, 0) == 0  # dry
        bulk = subprocess.Popen([*FSM, "cancel", "--machine", "console", "--status", "pending",
                                 "--yes", "--batch", "40", "--as", "ops"], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def some_cancelled() -> bool:
            return store.count(InstanceFilter(statuses=("cancelled",))).get(None, 0) >= 200
        wait_until(some_cancelled, 120, "the bulk cancel to get going")
        bulk.send_signal(signal.SIGKILL)
        bulk.wait(10)
        statuses = Counter(store.get(i).status for i in ids)
        assert set(statuses) <= {"cancelled", "pending"}
        assert 0 < statuses["cancelled"] < 2000, statuses  # killed mid-way
        assert statuses["cancelled"] % 40 == 0  # whole transactions only
        assert set(_cancels(store, ids).values()) == {1}

        again = _fsm("cancel", "--machine", "console", "--yes", "--batch", "40", env=env)
        assert f"{2000 - statuses['cancelled']} changed" in again.stdout
        assert Counter(store.get(i).status for i in ids) == {"cancelled": 2000}
        once = _cancels(store, ids)
        assert len(once) == 2000 and set(once.values()) == {1}  # none twice
        by = Counter(store.history(i)[-1].detail["operator"] for i in ids)
        assert by["ops"] == statuses["cancelled"]  # the rest by $USER, the default
        third = _fsm("cancel", "--machine", "console", "--yes", env=env)
        assert "0 changed" in third.stdout  # idempotent
    finally:
        store.close()


def test_send_from_the_command_line_validates_and_records_the_operator(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    env = _env(tmp_path, db)
    (tmp_path / "in.json").write_text(json.dumps({}))
    iid = _fsm("start", f"{MODULE}:inbox", "--input", str(tmp_path / "in.json"),
               env=env).stdout.strip()
    _fsm("resume", env=env, check=False)  # to its waiting state
    store = open_store(db)
    try:
        assert store.get(iid).status == "waiting"
        bad = _fsm("send", iid, "release", "--set", "count=many", env=env, check=False)
        assert bad.returncode == 2 and bad.stderr.startswith("fsm: error:")
        assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
        undeclared = _fsm("send", iid, "explode", env=env, check=False)
        assert undeclared.returncode == 2 and "explode" in undeclared.stderr
        assert len(store.history(iid)) == 0  # nothing written
        (tmp_path / "upd.json").write_text(json.dumps({"note": "from chat"}))
        _fsm("send", iid, "release", "--json-file", str(tmp_path / "upd.json"),
             "--set", "count=3", "--as", "cal", env=env)
        rec = store.get(iid)
        assert rec.status == "completed" and rec.context == {"note": "from chat", "count": 3}
        [row] = store.history(iid)
        assert row.trigger == "release" and row.detail["operator"] == "cal"
    finally:
        store.close()


def test_the_console_needs_a_token_even_on_loopback(tmp_path: Path) -> None:
    db = str(tmp_path / "fsm.db")
    env = _env(tmp_path, db)
    env.pop("FSM_UI_TOKEN", None)
    open_store(db).close()
    refused = _fsm("ui", "--write", "--port", "0", env=env, check=False)
    assert refused.returncode == 2
    assert refused.stderr == "fsm: error: --write needs --token (or FSM_UI_TOKEN), also on loopback\n"
    dry = _fsm("pause", "--machine", "none", env=env)
    assert "0 instance(s) match; --yes pauses them" in dry.stdout
    both = _fsm("pause", "abc", "--machine", "x", env=env, check=False)
    assert both.returncode == 2 and both.stderr.startswith("fsm: error: give instance ids")
