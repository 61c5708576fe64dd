"""``fsm schedule add|list|pause|resume|delete|backfill`` (issue 38, item 2): a schedule's
life from the terminal, and bad input — one line, exit 2, nothing written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from cli import BROKEN_MODULE, run_main
from tick_fleet import TICKED


def _tables(db: Path) -> dict[str, int]:
    """Rows per table of the store (none when it was never created)."""
    if not db.exists():
        return {}
    conn = sqlite3.connect(db)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: conn.execute(f"SELECT COUNT(*) FROM {n}").fetchone()[0] for n in names}
    finally:
        conn.close()


def test_a_schedule_from_add_to_delete(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(Path(TICKED).parents[2]))
    db = str(tmp_path / "fsm.db")
    (tmp_path / "in.json").write_text('{"label": "digest"}')
    code, out, err = run_main(["schedule", "add", "digest", TICKED, "--cron", "0 6 * * 1-5",
                               "--tz", "Europe/Paris", "--input", str(tmp_path / "in.json"),
                               "--db", db], capsys)
    assert code == 0, err
    assert out.startswith("schedule digest: cron 0 6 * * 1-5 (Europe/Paris); first tick")
    code, out, _ = run_main(["schedule", "list", "--json", "--db", db], capsys)
    [shown] = json.loads(out)
    assert (shown["name"], shown["machine"], shown["input"], shown["overlap"],
            shown["catchup"], shown["last_instance"]) == (
        "digest", "ticked", {"label": "digest"}, "skip", "none", None)
    assert shown["next_fire"].endswith(":00:00.000Z")  # 06:00 Paris is 05:00 or 04:00 UTC
    assert run_main(["schedule", "pause", "digest", "--db", db], capsys)[1] == \
        "schedule digest paused\n"
    assert "next tick" in run_main(["schedule", "resume", "digest", "--db", db], capsys)[1]
    code, out, err = run_main(["schedule", "backfill", "digest", "--from", "2026-11-30T00:00",
                               "--to", "2026-12-05T00:00", "--db", db], capsys)
    assert code == 0, err
    assert out.splitlines()[-1] == "5 started, 0 existed"  # Monday to Friday at 06:00
    assert "digest-20261130T050000Z started" in out
    code, out, _ = run_main(["schedule", "backfill", "digest", "--from", "2026-11-30T00:00",
                             "--to", "2026-12-05T00:00", "--db", db, "--json"], capsys)
    assert [f["new"] for f in json.loads(out)] == [False] * 5
    code, out, _ = run_main(["schedule", "list", "--db", db], capsys)
    assert "digest" in out and "ticked" in out
    code, out, _ = run_main(["show", "digest-20261130T050000Z", "--json", "--db", db], capsys)
    assert json.loads(out)["schedule"]["tick"] == "2026-11-30T05:00:00.000Z"  # fsm show
    code, out, _ = run_main(["show", "digest-20261130T050000Z", "--db", db], capsys)
    assert 'schedule: {"name": "digest", "tick": "2026-11-30T05:00:00.000Z"' in out
    assert run_main(["schedule", "delete", "digest", "--db", db], capsys)[0] == 0
    assert run_main(["schedule", "list", "--db", db], capsys)[1].startswith("no schedules")
    assert _tables(tmp_path / "fsm.db")["instances"] == 5  # a schedule's instances stay


@pytest.mark.parametrize(("args", "message"), [
    (["--cron", "61 * * * *"], "--cron '61 * * * *'"),
    (["--cron", "* * *"], "expected 5 fields"),
    (["--every", "2 seconds"], "--every '2 seconds'"),
    (["--every", "2s", "--cron", "* * * * *"], "exactly one of"),
    (["--every", "2s", "--tz", "Mars/Olympus"], "unknown time zone"),
    (["--every", "2s", "--overlap", "wait"], "--overlap 'wait'"),
    (["--every", "2s", "--catchup", "every"], "--catchup 'every'"),
    (["--every", "2s", "--input", "missing.json"], "input file not found"),
    (["--every", "2s", "--input", "BAD_INPUT"], "input does not fit Ctx"),
    (["--every", "2s", "MODULE:broken"], "machine 'broken' is invalid"),
    (["--every", "2s", "MODULE:hostname"], "cannot load machine"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path: Path, capsys, args,
                                                          message: str) -> None:
    db = tmp_path / "fsm.db"
    (tmp_path / "bad.json").write_text('{"label": 5}')
    (tmp_path / "broken.py").write_text(BROKEN_MODULE)
    module = TICKED
    argv = []
    for a in args:
        if a.startswith("MODULE:"):
            module = {"broken": str(tmp_path / "broken.py"), "hostname": "/etc/hostname"}[a[7:]]
        else:
            argv.append(str(tmp_path / "bad.json") if a == "BAD_INPUT" else a)
    code, out, err = run_main(["schedule", "add", "s", module, *argv, "--db", str(db)], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("fsm: error: ") and message in err and err.count("\n") == 1
    assert _tables(db) == {}  # not even created


def test_an_unknown_or_taken_name_is_refused_and_nothing_changes(tmp_path: Path,
                                                                 capsys) -> None:
    db = tmp_path / "fsm.db"
    assert run_main(["schedule", "add", "s", TICKED, "--every", "1h", "--db", str(db)],
                    capsys)[0] == 0
    before = _tables(db)
    code, _, err = run_main(["schedule", "add", "s", TICKED, "--every", "5s", "--db", str(db)],
                            capsys)
    assert code == 2 and err == "fsm: error: schedule 's' exists (fsm schedule delete s first)\n"
    for action in (["pause"], ["resume"], ["delete"],
                   ["backfill", "--from", "2026-01-01", "--to", "2026-01-02"]):
        code, _, err = run_main(["schedule", action[0], "nope", *action[1:], "--db", str(db)],
                                capsys)
        assert code == 2 and err.startswith("fsm: error: no schedule named 'nope'")
    code, _, err = run_main(["schedule", "add", "bad/name", TICKED, "--every", "1h",
                             "--db", str(db)], capsys)
    assert code == 2 and "schedule name" in err
    assert _tables(db) == before
    code, out, _ = run_main(["schedule", "list", "--json", "--db", str(db)], capsys)
    assert [(s["name"], s["every_s"]) for s in json.loads(out)] == [("s", 3600.0)]
