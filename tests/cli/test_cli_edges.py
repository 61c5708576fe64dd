"""CLI edge cases a first-time user hit: each ends in one line and the right exit code,
and a rejected run writes nothing."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from cli import MODERATION, ROUTER, VERDICT_LINE, finished_instance, inputs, run_main, write_script

from fsm_engine import Engine
from fsm_engine.sinks import append_jsonl


def one_error(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsm: error: "), err
    assert needle in lines[0], err


@pytest.fixture
def llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    monkeypatch.delenv("FSM_NOTIFY_URL", raising=False)
    return ["--llm", f"scripted:{write_script(tmp_path / 'v.jsonl', VERDICT_LINE)}"]


@pytest.mark.parametrize("argv, needle", [
    (["--budget", "0"], "--budget"),
    (["--concurrency", "-1"], "--concurrency"),
    (["--deadline", "-1"], "--deadline"),
    (["--bogus"], "No such option: --bogus"),
])
def test_bad_option_values_are_one_line(tmp_path, capsys, llm, argv, needle):
    db = tmp_path / "x.db"
    code, _, err = run_main(["run", MODERATION, "--input", inputs(1)[0], "--db", str(db),
                             *llm, *argv], capsys)
    one_error(code, err, needle)
    assert not db.exists()


def test_database_in_a_missing_directory(tmp_path, capsys, llm):
    code, _, err = run_main(["run", MODERATION, "--input", inputs(1)[0], "--db",
                             str(tmp_path / "no" / "such" / "x.db"), *llm], capsys)
    one_error(code, err, "no directory")


def test_a_bad_second_input_starts_nothing(tmp_path, capsys, llm):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"path": 5, "infer_attempts": "many"}))
    db = tmp_path / "x.db"
    code, _, err = run_main(["run", MODERATION, "--input", inputs(1)[0], str(bad),
                             "--db", str(db), *llm], capsys)
    one_error(code, err, "input does not fit")
    assert run_main(["list", "--db", str(db), "--json"], capsys)[1].strip() in ("", "[]")


def test_undecodable_file_name_is_stored_escaped(tmp_path, capsys, llm):
    name = os.fsdecode(b"caf\xe9.txt")
    path = tmp_path / name
    path.write_text("hello world, a calm text\n")
    code, out, err = run_main(["run", MODERATION, "--input", str(path), "--db",
                               str(tmp_path / "x.db"), *llm, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)[0]["status"] == "completed"


def test_directory_and_device_inputs_say_what_they_are(tmp_path, capsys, llm):
    code, _, err = run_main(["run", MODERATION, "--input", str(tmp_path), *llm], capsys)
    one_error(code, err, "is a directory")
    code, _, err = run_main(["run", MODERATION, "--input", "/dev/null", *llm], capsys)
    one_error(code, err, "not a regular file")


def test_module_that_exits_on_import(tmp_path, capsys):
    mod = tmp_path / "quits.py"
    mod.write_text("import sys\nsys.exit(3)\n")
    code, _, err = run_main(["diagram", str(mod)], capsys)
    one_error(code, err, "sys.exit(3)")


def test_ids_can_be_given_by_unique_prefix(tmp_path, capsys):
    db = str(tmp_path / "p.db")
    iid = finished_instance(db)
    code, out, err = run_main(["show", iid[:5], "--db", db, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["id"] == iid and "attempts" in json.loads(out)


def test_overlaying_another_machines_instance_is_refused(tmp_path, capsys):
    db = str(tmp_path / "p.db")
    iid = finished_instance(db)
    code, _, err = run_main(["diagram", ROUTER, "--instance", iid, "--db", db, "-o",
                             str(tmp_path / "w.svg")], capsys)
    one_error(code, err, "belongs to machine")


def test_diagram_creates_the_output_directory(tmp_path, capsys):
    target = tmp_path / "out" / "deep" / "m.dot"
    code, _, err = run_main(["diagram", MODERATION, "-o", str(target)], capsys)
    assert code == 0, err
    assert target.read_text().startswith("digraph")


def test_status_filter_is_checked(tmp_path, capsys):
    db = str(tmp_path / "p.db")
    finished_instance(db)
    code, _, err = run_main(["list", "--db", db, "--status", "bogus"], capsys)
    one_error(code, err, "unknown status 'bogus'")


def test_resume_with_nothing_to_do_says_so(tmp_path, capsys, llm):
    db = str(tmp_path / "p.db")
    finished_instance(db)
    code, out, err = run_main(["resume", "--db", db, *llm], capsys)
    assert code == 0, err
    assert "nothing to resume" in out


def test_a_run_counts_an_instance_cancelled_while_queued_as_cancelled(tmp_path):
    eng = Engine(str(tmp_path / "q.db"))
    first, second = eng.start_many(MODERATION, [{"path": p} for p in inputs(2)])
    eng.cancel(second)
    eng.concurrency = 1
    from conftest import GOOD_VERDICT, scripted
    eng.llm = scripted(GOOD_VERDICT)
    os.environ["FSM_NOTIFY_FILE"] = str(tmp_path / "n.jsonl")
    try:
        records = asyncio.run(eng.run_many([first, second]))
    finally:
        os.environ.pop("FSM_NOTIFY_FILE")
    assert [r.status for r in records] == ["completed", "cancelled"]


def test_file_sink_writes_each_key_once(tmp_path):
    path = str(tmp_path / "sink.jsonl")
    assert "duplicate" not in append_jsonl(path, {"n": 1}, "i:notify:1")
    assert append_jsonl(path, {"n": 1}, "i:notify:1")["duplicate"] is True
    append_jsonl(path, {"n": 2}, "i:notify:10")
    keys = [json.loads(line)["idempotency_key"] for line in open(path)]
    assert keys == ["i:notify:1", "i:notify:10"]


def test_a_broken_definition_creates_no_database(tmp_path, capsys, llm):
    from cli import BROKEN_MODULE
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN_MODULE)
    db = tmp_path / "x.db"
    code, _, err = run_main(["run", str(broken), "--input", inputs(1)[0], "--db", str(db),
                             *llm], capsys)
    one_error(code, err, "is invalid")
    assert not db.exists()


def test_read_only_commands_refuse_an_empty_file(tmp_path, capsys):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for argv in (["list"], ["outbox"], ["show", "abc"]):
        code, _, err = run_main([*argv, "--db", str(empty)], capsys)
        one_error(code, err, "no database at")
    assert empty.stat().st_size == 0  # left as it was


@pytest.mark.parametrize("value", ["abc", "", "-1", "2.0"])
def test_an_unreadable_schema_version_is_one_line(tmp_path, capsys, value):
    import sqlite3
    db = tmp_path / "x.db"
    finished_instance(str(db))
    conn = sqlite3.connect(db)
    conn.execute("UPDATE fsm_meta SET value=? WHERE key='schema_version'", (value,))
    conn.commit()
    conn.close()
    code, _, err = run_main(["list", "--db", str(db)], capsys)
    one_error(code, err, "unreadable fsm schema version")


def test_mermaid_goes_to_the_output_file(tmp_path, capsys):
    out = tmp_path / "router.mmd"
    code, stdout, err = run_main(["diagram", ROUTER, "--mermaid", "-o", str(out)], capsys)
    assert code == 0, err
    assert out.read_text().lstrip().startswith("stateDiagram-v2")
    assert "stateDiagram-v2" not in stdout
