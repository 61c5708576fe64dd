"""Migration of stored instances: lazy upcasts in the step's transaction, `fsm migrate`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsm_engine import (
    DefinitionError,
    Engine,
    FingerprintMismatch,
    Machine,
    NeedsMigration,
    State,
    Transition,
    VersionTooNew,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "helpers"))
import migration_machines as mm  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def fsm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsm_engine.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})


def _v1_instances(url: str, module: str, texts: list[str], steps: int,
                  **more: str) -> list[str]:
    """Start one instance per text (with the ``more`` fields) and step each ``steps`` times."""
    engine = Engine(url)
    try:
        ids = engine.start_many(module, [{"text": t, **more} for t in texts])
        for _ in range(steps):
            for iid in ids:
                asyncio.run(engine.step(iid))
    finally:
        engine.close()
    return ids


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine file, under the machines root: an engine (or `fsm migrate`) that did not
    start its instances imports it only from there (``runtime.loader.Trust``)."""
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(tmp_path))
    return tmp_path / "flow.py"


def test_v1_instances_are_upcast_with_their_next_step_and_complete(
        store_url: str, module: Path) -> None:
    mm.write(module, mm.V1)
    fresh, = _v1_instances(store_url, str(module), ["a fresh one"], steps=0)
    moved, = _v1_instances(store_url, str(module), ["two words"], steps=1)
    before = Engine(store_url)
    assert before.store.get(moved).state == "check"
    before.close()
    mm.write(module, mm.V2)
    engine = Engine(store_url)
    try:
        done = asyncio.run(engine.run_many([fresh, moved]))
        assert [(r.status, r.state, r.machine_version) for r in done] == [("completed", "done", 2)] * 2
        a, b = done
        assert (a.context["lang"], a.context["checked"], a.context["words"]) == ("en", True, 3)
        ha, hb = engine.store.history(fresh), engine.store.history(moved)
        # the fresh one: given back by the engine that started it and closed (no takeover
        # row), then upcast and its first step in one commit (consecutive rows)
        assert [(h.kind, h.source, h.dest, h.machine_version) for h in ha] == [
            ("migration", "start", "start", 2),
            ("transition", "start", "validate", 2), ("transition", "validate", "done", 2)]
        assert ha[0].delta == {"lang": "en", "checked": False}  # defaults filled in too
        assert ha[0].detail["from_version"] == 1
        # the moved one keeps the version its first row was written in; "check" maps
        assert [(h.kind, h.source, h.dest, h.machine_version) for h in hb] == [
            ("transition", "start", "check", 1), ("migration", "check", "validate", 2),
            ("transition", "validate", "done", 2)]
        assert hb[1].detail["renamed"] == ["check", "validate"]
        assert b.visits == {"start": 1, "validate": 1, "done": 1}
        assert engine.store.check() == []
    finally:
        engine.close()
    # a migration row is a record of the runtime, not a step: fsm stats counts only moves
    stats = fsm("stats", "--db", store_url, "--json")
    assert stats.returncode == 0, stats.stderr
    figures = json.loads(stats.stdout)[next(iter(json.loads(stats.stdout)))]
    assert sum(st["steps"] for st in figures["states"].values()) == 4  # 7 rows: 1 takeover, 2 migrations
    assert all(e["kind"] not in ("migration", "recovery") for e in figures["edges"])


def test_unmapped_removed_state_needs_migration_and_is_left_untouched(
        db_path: str, module: Path) -> None:
    mm.write(module, mm.V1)
    iid, = _v1_instances(db_path, str(module), ["legacy text"], steps=1)
    mm.write(module, mm.V2)
    engine = Engine(db_path)
    try:
        stored = engine.store.get(iid)
        with pytest.raises(NeedsMigration, match="state 'legacy' no longer exists") as err:
            asyncio.run(engine.step(iid))
        assert err.value.cause.startswith("state 'legacy'")
        assert engine.store.get(iid) == stored  # nothing written, not even a claim
        [out] = asyncio.run(engine.resume())  # a worker leaves it alone, saying why
        assert isinstance(out, NeedsMigration)
        rec = engine.store.get(iid)
        assert (rec.state, rec.context, rec.seq, rec.machine_version, rec.status) == (
            stored.state, stored.context, stored.seq, 1, stored.status)
        assert rec.reason == "needs_migration" and "no longer exists" in rec.last_error
        assert len(engine.store.history(iid)) == 1
    finally:
        engine.close()
    shown = json.loads(fsm("show", iid, "--db", db_path, "--json").stdout)
    assert (shown["reason"], shown["machine_version"]) == ("needs_migration", 1)
    listed = fsm("list", "--db", db_path, "--reason", "needs_migration")
    assert iid in listed.stdout


def test_a_newer_stored_version_is_refused_naming_both(db_path: str, module: Path) -> None:
    mm.write(module, mm.V2)
    iid, = _v1_instances(db_path, str(module), ["from the future"], steps=0, lang="en")
    mm.write(module, mm.V1)
    engine = Engine(db_path)
    try:
        stored = engine.store.get(iid)
        with pytest.raises(VersionTooNew, match="machine version 2; this code has version 1"):
            asyncio.run(engine.step(iid))
        assert engine.store.get(iid) == stored
    finally:
        engine.close()
    out = fsm("migrate", "--db", db_path, "--yes")
    assert out.returncode == 0, out.stderr
    assert "refused: newer version" in out.stdout
    engine = Engine(db_path)
    assert engine.store.get(iid) == stored  # row untouched
    engine.close()


def test_a_fingerprint_change_without_a_version_bump_is_refused(db_path: str,
                                                                 module: Path) -> None:
    mm.write(module, mm.V1)
    iid, = _v1_instances(db_path, str(module), ["same version"], steps=0)
    mm.write(module, mm.V1_CHANGED)
    engine = Engine(db_path)
    try:
        with pytest.raises(FingerprintMismatch, match="bump the machine's version to 2"):
            asyncio.run(engine.step(iid))
    finally:
        engine.close()
    out = fsm("step", iid, "--db", db_path)
    assert out.returncode == 2 and out.stderr.startswith("fsm: error: ") and \
        "bump the machine's version" in out.stderr and "Traceback" not in out.stderr


def test_fsm_migrate_dry_run_then_yes(db_path: str, module: Path) -> None:
    mm.write(module, mm.V1)
    ids = _v1_instances(db_path, str(module), ["good one", "boom", "bad", "legacy x"], steps=1)
    mm.write(module, mm.V2)
    before = Engine(db_path)
    stored = [before.store.get(i) for i in ids]
    before.close()
    dry = fsm("migrate", "--db", db_path, "--json")
    assert dry.returncode == 1, dry.stderr  # some cannot be migrated
    report = {e["id"]: e for e in json.loads(dry.stdout)["instances"]}
    good, boom, bad, legacy = (report[i] for i in ids)
    assert (good["outcome"], good["from_version"], good["to_version"]) == ("migrate", 1, 2)
    assert good["diff"] == {"from_version": 1, "to_version": 2, "state": ["check", "validate"],
                            "added": {"lang": "en", "checked": False}, "changed": {},
                            "removed": []}
    assert boom["outcome"] == "needs_migration" and "raised ValueError" in boom["cause"]
    assert bad["outcome"] == "needs_migration" and "fails Ctx" in bad["cause"]
    assert legacy["outcome"] == "needs_migration" and "'legacy'" in legacy["cause"]
    engine = Engine(db_path)
    assert [engine.store.get(i) for i in ids] == stored  # the dry run wrote nothing
    engine.close()
    text = fsm("migrate", "--db", db_path)
    assert "would migrate: state check -> validate, +lang=\"en\"" in text.stdout
    applied = fsm("migrate", "--db", db_path, "--yes")
    assert applied.returncode == 1 and "1 migrated" in applied.stdout, applied.stdout
    engine = Engine(db_path)
    try:
        recs = [engine.store.get(i) for i in ids]
        assert (recs[0].machine_version, recs[0].state, recs[0].context["lang"]) == (
            2, "validate", "en")
        for old, new in zip(stored[1:], recs[1:], strict=False):  # kept where they are, with the cause
            assert (new.state, new.context, new.seq, new.machine_version) == (
                old.state, old.context, old.seq, 1)
            assert new.reason == "needs_migration" and new.last_error
        assert asyncio.run(engine.run(ids[0])).status == "completed"
        assert [h.kind for h in engine.store.history(ids[0])] == [
            "transition", "migration", "transition"]
    finally:
        engine.close()


def test_definition_check_names_every_version_problem() -> None:
    from pydantic import BaseModel

    class C(BaseModel):
        x: int = 0

    from fsm_engine.definition import check
    with pytest.raises(DefinitionError) as err:
        check(Machine("m", context=C, initial="a", version=3,
                      migrations={2: lambda a, b: a, 5: None},
                      renamed_states={"old": "nowhere", "a": "b"},
                      states=[State("a", action=lambda c: {}), State("b", final=True)],
                      transitions=[Transition("go", "a", "b")]))
    text = str(err.value)
    for part in ("migrations[5]: not a version in 2..3", "missing 3",
                 "migrations[2]: must be a function of one argument",
                 "renamed_states['old']: target 'nowhere'", "'a' is still a declared state"):
        assert part in text


def _counts(path: str) -> tuple[int, int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT count(*), coalesce(sum(machine_version = 2), 0) "
                            "FROM instances").fetchone()
    finally:
        conn.close()


def _wholly(engine: Engine, iid: str) -> int:
    """The instance's version, asserting it is wholly migrated or wholly not."""
    rec, rows = engine.store.get(iid), engine.store.history(iid)
    kinds = [h.kind for h in rows]
    if rec.machine_version == 2:
        assert kinds == ["migration"] and rec.seq == 1 and rec.context["lang"] == "en"
        assert rows[0].machine_version == 2 and rec.fingerprint == rows[0].detail["to_fingerprint"]
    else:
        assert kinds == [] and rec.seq == 0 and "lang" not in rec.context, (iid, rec, rows)
    return rec.machine_version


@pytest.mark.slow
def test_sigkill_during_fsm_migrate_leaves_each_instance_wholly_migrated_or_not(
        db_path: str, module: Path) -> None:
    n, batch = 3000, 7
    mm.write(module, mm.V1)
    engine = Engine(db_path)
    ids = engine.start_many(str(module), [{"text": f"t {i}"} for i in range(n)], enqueue=True)
    engine.close()
    mm.write(module, mm.V2)
    cmd = [sys.executable, "-m", "fsm_engine.cli", "migrate", "--db", db_path, "--yes",
           "--batch", str(batch)]
    seen, kills = 0, 0
    for share in (0.05, 0.2, 0.4, 0.6, 0.8, 0.95):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        while proc.poll() is None and _counts(db_path)[1] < share * n:
            time.sleep(0.002)  # a poll of the database, not a synchronisation
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        migrated = _counts(db_path)[1]
        assert (migrated - seen) % batch == 0, "a batch was written in part"
        seen = migrated
        check = Engine(db_path)
        try:
            assert sum(_wholly(check, i) == 2 for i in ids) == migrated
            assert check.store.check() == []
        finally:
            check.close()
    assert kills >= 5 and 0 < seen < n, (kills, seen)
    assert fsm("migrate", "--db", db_path, "--yes").returncode == 0
    assert _counts(db_path) == (n, n)


@pytest.mark.slow
def test_a_kill_between_the_lazy_upcast_and_its_step_leaves_it_unmigrated(
        db_path: str, module: Path, tmp_path: Path) -> None:
    mm.write(module, mm.V1)
    iid, = _v1_instances(db_path, str(module), ["two words"], steps=1)
    mm.write(module, mm.V2)
    marker = tmp_path / "in-validate"
    proc = subprocess.Popen([sys.executable, "-m", "fsm_engine.cli", "resume", "--db", db_path],
                            cwd=ROOT, env={**os.environ, "FLOW_BLOCK": str(marker)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not marker.exists():  # the action of the upcast instance's next step runs
            assert proc.poll() is None, "fsm resume ended before the step"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    engine = Engine(db_path)
    try:
        rec = engine.store.get(iid)
        assert (rec.machine_version, rec.state, rec.seq) == (1, "check", 1)
        assert "lang" not in rec.context and len(engine.store.history(iid)) == 1
        done = asyncio.run(engine.run(iid))  # the next run upcasts it with its step
        assert (done.status, done.machine_version) == ("completed", 2)
        rows = engine.store.history(iid)
        # taken over from the killed resume, mid-step (that step runs again, upcast first)
        assert [h.kind for h in rows] == ["transition", "recovery", "migration", "transition"]
        info = rows[1].detail["recovery"]
        assert (info["from_pid"], info["cause"], info["mid_step"]) == (proc.pid, "process_gone",
                                                                       True)
        assert rows[1].machine_version == 1 and rows[2].machine_version == 2
    finally:
        engine.close()


def test_an_upcast_attaches_only_to_a_step_built_from_it(db_path: str, module: Path) -> None:
    from fsm_engine.runtime import outcome
    from fsm_engine.runtime.kinds import migration
    mm.write(module, mm.V1)
    iid, = _v1_instances(db_path, str(module), ["two words"], steps=1)
    mm.write(module, mm.V2)
    engine = Engine(db_path)
    try:
        stored = engine.store.get(iid)
        cm = engine.definition(stored)
        up = migration.plan(cm, stored, 2e9)
        assert up is not None and up.record.version == stored.version
        assert not migration.attach(outcome.marked(stored, "x", "y", 2e9), up)  # not derived
        step = outcome.marked(up.record, "x", "y", 2e9)
        assert migration.attach(step, up) and step.history == [up.row] and step.before is stored
        assert not migration.attach(step, up)  # once
        assert engine.store.commit([step]) == [True]
        assert engine.store.get(iid).machine_version == 2 and engine.store.check() == []
    finally:
        engine.close()
