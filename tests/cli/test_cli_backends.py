"""The read-side commands on every backend (``--db`` a SQLite file or ``postgresql://…``):
``fsm stats``, ``fsm list``, ``fsm prune``, ``fsm check`` and ``fsm ui`` (a real server
process on a read-only connection), plus read-only opening itself."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import httpx
import pytest
from typer.testing import CliRunner

from fsm_engine import StoreError
from fsm_engine.cli import app
from fsm_engine.store import InstanceFilter, StepCommit, WorkerRow, open_store
from fsm_engine.testing.contract import fleet
from fsm_engine.testing.postgres import PASSWORD

runner = CliRunner()
ENTRY = [sys.executable, "-c", "from fsm_engine.cli import main; main()"]


@pytest.fixture
def url(store_url: str) -> str:
    """``store_url`` holding the contract's five-instance fleet (machines m1, m2)."""
    store = open_store(store_url)
    try:
        fleet(store)
    finally:
        store.close()
    return store_url


def fsm(*args: str) -> object:
    return runner.invoke(app, list(args))


def test_stats_and_list(url: str) -> None:
    result = fsm("stats", "--db", url, "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert sorted(figures) == ["m1", "m2"]
    assert figures["m1"]["instances"] == 4
    assert figures["m1"]["by_status"] == {"completed": 1, "failed": 1, "running": 1, "pending": 1}
    assert figures["m1"]["states"]["start"]["steps"] == 3  # the first steps of a, b, c
    listed = fsm("list", "--db", url, "--json", "--status", "completed")
    assert listed.exit_code == 0, listed.output
    assert sorted(r["id"] for r in json.loads(listed.stdout)) == ["a", "d"]
    text = fsm("list", "--db", url, "--json", "--text", "NEEDLE")
    assert [r["id"] for r in json.loads(text.stdout)] == ["d"]


def test_prune_then_check(url: str) -> None:
    assert fsm("check", "--db", url).exit_code == 0
    dry = fsm("prune", "--db", url, "--older-than", "0s", "--json")
    assert json.loads(dry.stdout) == {"matching": 3, "deleted": 0, "skipped": 0,
                                       "dry_run": True}
    real = fsm("prune", "--db", url, "--older-than", "0s", "--yes", "--batch", "2", "--json")
    assert json.loads(real.stdout) == {"matching": 3, "deleted": 3, "skipped": 0,
                                        "dry_run": False}
    store = open_store(url)
    try:
        assert sorted(r.id for r in store.list()) == ["c", "e"]
        assert store.outbox() == [] and store.attempts("b") == []
        assert fsm("check", "--db", url).exit_code == 0
        odd = store.get("c")
        store.commit([StepCommit(replace(odd, state="elsewhere"), odd.version)])
    finally:
        store.close()
    found = fsm("check", "--db", url, "--json")
    assert found.exit_code == 1
    assert json.loads(found.stdout)["problems"] == [
        "instance c: state 'elsewhere' but its last history row went to 'work'"]


def test_read_only_store_reads_and_refuses_writes(url: str) -> None:
    store = open_store(url, readonly=True)
    try:
        assert store.count(InstanceFilter()) == {None: 5}
        assert store.check() == []
        with pytest.raises(StoreError):
            store.put_worker(WorkerRow("w", "h", 1, "1", 0.0, 0.0))
        with pytest.raises(StoreError):
            store.delete(["a"])
    finally:
        store.close()
    again = open_store(url)
    try:
        assert again.get("a").id == "a" and again.workers() == []
    finally:
        again.close()


def test_ui_serves_the_fleet_read_only(url: str) -> None:
    proc = subprocess.Popen([*ENTRY, "ui", "--db", url, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "read-only on http://127.0.0.1:" in line, (line, proc.stderr.read()
                                                           if proc.poll() is not None else "")
        assert PASSWORD not in line  # the store's URL is shown without its password
        base = line.split(" on ")[1].split()[0]
        page = httpx.get(base, timeout=10)
        assert page.status_code == 200 and "m2" in page.text
        detail = httpx.get(base + "instances/d", timeout=10)
        assert detail.status_code == 200 and "Needle here" in detail.text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def test_ui_on_a_missing_database_is_one_line(tmp_path, pg_cluster) -> None:  # noqa: ANN001
    for missing in (str(tmp_path / "none.db"), pg_cluster.database()):
        result = subprocess.run([*ENTRY, "ui", "--db", missing, "--port", "0"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith("fsm: error: no fsm database") or \
            result.stderr.startswith("fsm: error: no database"), result.stderr
        assert result.stderr.count("\n") == 1 and PASSWORD not in result.stderr


@pytest.mark.slow
def test_run_on_workers_ends_like_a_local_run(tmp_path, pg_cluster) -> None:  # noqa: ANN001
    """``fsm run`` on postgresql:// (enqueued, run by a worker) closes with the same
    outcome row and tally as ``fsm run --local``."""
    import os
    import signal

    from conftest import MACHINES, ROOT
    url = pg_cluster.database()
    replies = tmp_path / "good.jsonl"
    replies.write_text(json.dumps({"text": json.dumps(
        {"decision": "approve", "categories": [], "summary": "fine"})}) + "\n")
    env = {**os.environ, "FSM_NOTIFY_FILE": str(tmp_path / "notes.jsonl")}
    worker = subprocess.Popen([*ENTRY, "worker", "--db", url, "--poll", "0.2", "--llm",
                               f"scripted:{replies}"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ran = subprocess.run([*ENTRY, "run", str(MACHINES / "moderation.py"), "--db", url,
                              "--input", "/usr/share/common-licenses/BSD"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert ran.returncode == 0, ran.stderr
    assert "decision=approve, verdict_source=model" in ran.stdout  # the outcome row
    assert "verdict_source: 1 model" in ran.stdout  # the machine's tally
