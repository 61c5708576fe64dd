"""Tests for the ``fsm`` command line.

Error paths run the real entry point (``fsm_engine.cli.main``): the common ones
in subprocesses (started a few at a time by one module fixture), so exit code
and stderr are exactly what a user sees; the rest call the same ``main()``
in-process, which is cheaper.  Happy paths run in-process with typer's
CliRunner against a scripted model.  (``cli.py`` has no
``if __name__ == "__main__"``, so ``python -m fsm_engine.cli`` would do nothing.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli import (
    BROKEN_MODULE,
    ENTRY,
    MODERATION,
    ROUTER,
    VERDICT_LINE,
    finished_instance,
    inputs,
    run_main,
    write_script,
)
from conftest import ROOT
from typer.testing import CliRunner

from fsm_engine import Engine
from fsm_engine.cli import app

GARBAGE_LINE = json.dumps({"text": "I think it is fine, no JSON here.", "prompt_tokens": 40,
                           "completion_tokens": 30})


def foreign_sqlite(path: Path) -> str:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()
    return str(path)


# -- error paths --------------------------------------------------------------------------
@dataclass
class Ran:
    args: list[str]
    code: int
    out: str
    err: str
    needle: str = ""


#: run in real subprocesses (the brief's minimum: what a user types most)
SUBPROCESS_CASES = [
    "run-missing-module", "run-broken-definition", "run-unknown-llm",
    "show-unknown-id", "history-unknown-id", "step-unknown-id", "cancel-unknown-id",
    "list-text-file", "show-text-file", "list-foreign-sqlite", "show-foreign-sqlite",
    "list-missing-db", "cancel-finished",
]
#: run in-process through the same ``main()`` (cheaper; same error translation)
INPROCESS_CASES = [
    "run-syntax-error", "run-missing-input", "step-finished", "outbox-missing-db",
    "list-default-db-missing", "diagram-broken-definition", "diagram-missing-module",
    "run-deep-script",
]


def error_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """case name -> (argv, text the one error line must contain)."""
    script = write_script(tmp / "verdict.jsonl", VERDICT_LINE)
    broken = tmp / "broken.py"
    broken.write_text(BROKEN_MODULE)
    syntax = tmp / "syntax.py"
    syntax.write_text("def oops(:\n")
    notes = tmp / "notes.txt"
    notes.write_text("not a database\n")
    good = str(tmp / "good.db")
    done_id = finished_instance(good)
    inp = inputs(1)[0]
    llm = ["--llm", f"scripted:{script}"]

    def run(module: str, case: str, *extra: str) -> list[str]:
        return ["run", module, "--input", inp, "--db", str(tmp / f"{case}.db"), *llm, *extra]

    return {
        "run-missing-module": (run(str(tmp / "nope.py"), "a"), "nope.py"),
        "run-broken-definition": (run(str(broken), "b"), "'leap'"),
        "run-syntax-error": (run(str(syntax), "c"), "syntax error at line 1"),
        "run-unknown-llm": (["run", MODERATION, "--input", inp, "--db", str(tmp / "d.db"),
                             "--llm", "bogus"], "unknown LLM provider 'bogus'"),
        "run-missing-input": (["run", MODERATION, "--input", str(tmp / "absent.txt"), "--db",
                               str(tmp / "e.db"), *llm], "input file not found"),
        "show-unknown-id": (["show", "deadbeef0000", "--db", good], "'deadbeef0000'"),
        "history-unknown-id": (["history", "deadbeef0000", "--db", good], "'deadbeef0000'"),
        "step-unknown-id": (["step", "deadbeef0000", "--db", good, *llm], "'deadbeef0000'"),
        "cancel-unknown-id": (["cancel", "deadbeef0000", "--db", good], "'deadbeef0000'"),
        "cancel-finished": (["cancel", done_id, "--db", good], "already completed"),
        "step-finished": (["step", done_id, "--db", good, *llm], "already completed"),
        "list-text-file": (["list", "--db", str(notes)], "not an fsm database"),
        "show-text-file": (["show", "x", "--db", str(notes)], "not an fsm database"),
        "list-foreign-sqlite": (["list", "--db", foreign_sqlite(tmp / "shop1.db")],
                                "not an fsm database"),
        "show-foreign-sqlite": (["show", "x", "--db", foreign_sqlite(tmp / "shop2.db")],
                                "not an fsm database"),
        "list-missing-db": (["list", "--db", str(tmp / "absent.db")], "no database at"),
        "list-default-db-missing": (["list"], "no database at fsm.db"),
        "outbox-missing-db": (["outbox", "--db", str(tmp / "absent.db")], "no database at"),
        "diagram-broken-definition": (["diagram", str(broken)], "'void'"),
        "diagram-missing-module": (["diagram", str(tmp / "nope.py")], "nope.py"),
        "run-deep-script": (["run", MODERATION, "--input", inp, "--db", str(tmp / "f.db"),
                             "--llm", "scripted:" + write_script(
                                 tmp / "deep.jsonl", "[" * 5000 + "]" * 5000)],
                            "deep.jsonl:1: bad script line: nests deeper than"),
    }


def child_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FSM_LLM", "OPENAI_BASE_URL", "FSM_NOTIFY_URL")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["FSM_NOTIFY_FILE"] = str(tmp / "notifications.jsonl")
    return env


@pytest.fixture(scope="module")
def error_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every SUBPROCESS_CASES command run by the real entry point, a few at a time."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    cwd = tmp / "cwd"
    cwd.mkdir()
    cases, env = error_cases(tmp), child_env(tmp)

    def one(name: str) -> Ran:
        argv, needle = cases[name]
        proc = subprocess.run(ENTRY + argv, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=120)
        return Ran(argv, proc.returncode, proc.stdout, proc.stderr, needle)
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(SUBPROCESS_CASES, pool.map(one, SUBPROCESS_CASES), strict=False))


def assert_one_line_error(r: Ran, case: str) -> None:
    detail = f"{case}: code={r.code}\nstdout={r.out!r}\nstderr={r.err!r}"
    assert r.code == 2, detail
    assert "Traceback" not in r.err + r.out, detail
    lines = r.err.strip("\n").splitlines()
    assert len(lines) == 1, detail
    assert lines[0].startswith("fsm: error: "), detail
    assert r.needle in lines[0], detail
    assert r.out.strip() == "", detail


def test_case_lists_cover_every_case(tmp_path: Path) -> None:
    assert sorted(SUBPROCESS_CASES + INPROCESS_CASES) == sorted(error_cases(tmp_path))


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_user_error_in_subprocess_is_one_line_exit_2(error_runs: dict[str, Ran],
                                                     case: str) -> None:
    assert_one_line_error(error_runs[case], case)


@pytest.mark.parametrize("case", INPROCESS_CASES)
def test_user_error_via_main_is_one_line_exit_2(case: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    argv, needle = error_cases(tmp_path)[case]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for key, value in child_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("FSM_LLM", raising=False)
    code, out, err = run_main(argv, capsys)
    assert_one_line_error(Ran(argv, code, out, err, needle), case)
    assert not (cwd / "fsm.db").exists()


def test_db_that_is_a_directory_is_one_line_exit_2(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "adir").mkdir()
    code, out, err = run_main(["list", "--db", str(tmp_path / "adir")], capsys)
    assert_one_line_error(Ran([], code, out, err, str(tmp_path / "adir")), "list-directory")


def test_broken_definition_names_every_problem(error_runs: dict[str, Ran]) -> None:
    line = error_runs["run-broken-definition"].err.strip()
    assert "machine 'broken' is invalid" in line
    assert "unknown dest state 'void'" in line
    assert "'island' is unreachable" in line


# -- happy paths: in-process CliRunner ---------------------------------------------------
runner = CliRunner()


def invoke(args: list[Any], env: dict[str, str | None] | None = None) -> Any:
    return runner.invoke(app, [str(a) for a in args], env=env)


def ok_json(args: list[Any], env: dict[str, str | None] | None = None) -> Any:
    result = invoke(args, env)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


@dataclass
class Fleet:
    db: str
    script: str
    env: dict[str, str | None]
    notify: Path
    records: list[dict[str, Any]]
    inputs: list[str]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """Two moderation instances run to completion by ``fsm run`` with a scripted model."""
    tmp = tmp_path_factory.mktemp("cli_run")
    notify = tmp / "notifications.jsonl"
    env: dict[str, str | None] = {"FSM_NOTIFY_FILE": str(notify), "FSM_NOTIFY_URL": None,
                                  "FSM_LLM": None}
    script = write_script(tmp / "verdict.jsonl", VERDICT_LINE)
    files = inputs(2)
    db = str(tmp / "fsm.db")
    args = ["run", MODERATION, "--input", files[0], "--input", files[1], "--db", db,
            "--llm", f"scripted:{script}", "--json"]
    records = ok_json(args, env)
    return Fleet(db, script, env, notify, records, files)


def test_run_completes_every_instance(fleet: Fleet) -> None:
    assert len(fleet.records) == 2
    assert [(r["status"], r["state"]) for r in fleet.records] == [("completed", "done")] * 2
    assert sorted(r["context"]["path"] for r in fleet.records) == sorted(fleet.inputs)
    assert {r["context"]["verdict"]["decision"] for r in fleet.records} == {"approve"}
    sent = [json.loads(line) for line in fleet.notify.read_text().splitlines()]
    assert sorted(s["instance_id"] for s in sent) == sorted(r["id"] for r in fleet.records)


def test_list_json(fleet: Fleet) -> None:
    rows = ok_json(["list", "--db", fleet.db, "--json"])
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in fleet.records)
    for r in rows:
        assert {"id", "machine", "state", "status", "loop_count", "tokens_used",
                "token_budget"} <= set(r)
        assert (r["machine"], r["state"], r["status"]) == ("moderation", "done", "completed")
        assert r["tokens_used"] == 15  # one scripted call: 10 prompt + 5 completion
        assert r["token_budget"] == 6000
        assert r["loop_count"] >= 7


def test_list_status_filter(fleet: Fleet) -> None:
    assert ok_json(["list", "--db", fleet.db, "--status", "failed", "--json"]) == []
    assert len(ok_json(["list", "--db", fleet.db, "--status", "completed", "--json"])) == 2


def test_list_table(fleet: Fleet) -> None:
    result = invoke(["list", "--db", fleet.db])
    assert result.exit_code == 0
    assert result.stdout.count("completed") == 2


def test_show_json(fleet: Fleet) -> None:
    iid = fleet.records[0]["id"]
    shown = ok_json(["show", iid, "--db", fleet.db, "--json"])
    assert {"id", "state", "status", "reason", "loop_count", "max_transitions", "tokens_used",
            "token_budget", "context"} <= set(shown)
    assert (shown["id"], shown["status"], shown["reason"], shown["max_transitions"]) == \
        (iid, "completed", None, 30)
    assert shown["context"]["result"]["decision"] == "approve"


def test_show_prints_each_field_on_one_line_whatever_the_width(fleet: Fleet) -> None:
    iid = fleet.records[0]["id"]
    result = invoke(["show", iid, "--db", fleet.db], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert json.loads(fields["context"]) == fleet.records[0]["context"]  # not cut at 80


def test_history_json(fleet: Fleet) -> None:
    rec = fleet.records[0]
    rows = ok_json(["history", rec["id"], "--db", fleet.db, "--json"])
    for r in rows:
        assert {"seq", "source", "dest", "trigger", "tokens", "error"} <= set(r)
        assert r["error"] is None
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert len(rows) == rec["loop_count"]
    assert rows[0]["source"] == "init" and rows[-1]["dest"] == "done"
    assert all(a["dest"] == b["source"] for a, b in zip(rows, rows[1:], strict=False))
    assert sum(r["tokens"] for r in rows) == rec["tokens_used"]
    assert [r["trigger"] for r in rows][:3] == ["start", "collected", "prepared"]


def test_history_table(fleet: Fleet) -> None:
    result = invoke(["history", fleet.records[0]["id"], "--db", fleet.db], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "notified" in result.stdout  # names whole when they fit


def test_history_table_keeps_every_column_in_80_columns(tmp_path: Path) -> None:
    # long state names (degraded-infer, rule-verdict) and a long error: all nine columns shown
    db = str(tmp_path / "h.db")
    down = write_script(tmp_path / "down.jsonl", '{"text": "", "error": "unavailable"}')
    ran = invoke(["run", MODERATION, "--input", inputs(1)[0], "--db", db, "--llm", f"scripted:{down}",
                  "--json"], env={"FSM_NOTIFY_FILE": str(tmp_path / "n.jsonl")})
    iid = json.loads(ran.stdout)[0]["id"]
    result = invoke(["history", iid, "--db", db], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()[1:]  # under the title
    assert max(map(len, lines)) <= 80
    assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in lines), result.stdout  # not cropped
    assert lines[-1].count("┴") == 8  # nine columns
    header = next(line for line in lines if "seq" in line)
    for col in ("seq", "at", "source", "dest", "guards", "ms", "tokens", "note"):
        assert col in header, (col, header)
    assert "Provid" in result.stdout  # the error itself, folded but there


def test_outbox_json(fleet: Fleet) -> None:
    rows = ok_json(["outbox", "--db", fleet.db, "--json"])
    completed = {r["id"] for r in fleet.records if r["status"] == "completed"}
    assert sorted(r["instance_id"] for r in rows) == sorted(completed)
    for r in rows:
        assert (r["status"], r["state"], r["attempts"]) == ("done", "notify", 1)
        assert r["key"] == f"{r['instance_id']}:notify:1"


def test_diagram_mermaid(fleet: Fleet) -> None:
    result = invoke(["diagram", ROUTER, "--mermaid"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.lstrip().startswith("stateDiagram-v2")
    assert 'state "draft" as' in text and "[*] --> " in text and ": revise" in text


def test_diagram_svg(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "moderation.svg"
    result = invoke(["diagram", MODERATION, "-o", out])
    assert result.exit_code == 0, result.output
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    labels = {t.text for t in root.iter() if t.tag.endswith("text")}
    assert {"degraded-infer", "notify", "done"} <= labels


def test_diagram_instance_overlay(fleet: Fleet, tmp_path: Path) -> None:
    iid = fleet.records[0]["id"]
    result = invoke(["diagram", MODERATION, "--instance", iid, "--db", fleet.db])
    assert result.exit_code == 0, result.output
    dot = result.stdout
    assert dot.startswith("digraph")
    assert iid in dot and "×1" in dot and '"start ×1"' in dot
    assert '"give_up"' not in dot and "label=give_up" in dot  # untaken edge: no count
    out = tmp_path / "overlay.dot"
    assert invoke(["diagram", MODERATION, "--instance", iid, "--db", fleet.db, "-o", out]
                  ).exit_code == 0
    assert "notified ×1" in out.read_text()


def pending_instance(db: str, files: list[str]) -> str:
    eng = Engine(db)
    try:
        return eng.start(MODERATION, {"path": files[0]})
    finally:
        eng.close()


def test_cancel_pending_instance(fleet: Fleet, tmp_path: Path) -> None:
    db = str(tmp_path / "cancel.db")
    iid = pending_instance(db, fleet.inputs)
    result = invoke(["cancel", iid, "--db", db])
    assert result.exit_code == 0, result.output
    assert "cancelled" in result.stdout
    shown = ok_json(["show", iid, "--db", db, "--json"])
    assert (shown["status"], shown["state"], shown["reason"]) == ("cancelled", "init", "cancelled")
    rows = ok_json(["history", iid, "--db", db, "--json"])
    assert [(r["seq"], r["trigger"]) for r in rows] == [(1, "cancel")]


def test_step_runs_exactly_one_transition(fleet: Fleet, tmp_path: Path) -> None:
    db = str(tmp_path / "step.db")
    iid = pending_instance(db, fleet.inputs)
    rec = ok_json(["step", iid, "--db", db, "--llm", f"scripted:{fleet.script}", "--json"],
                  fleet.env)
    assert (rec["id"], rec["state"], rec["loop_count"], rec["status"]) == \
        (iid, "collect", 1, "running")
    assert rec["owner"] is None  # released after the step


@pytest.mark.parametrize("script_line", [VERDICT_LINE, GARBAGE_LINE], ids=["valid", "garbage"])
def test_run_with_tiny_budget_ends_every_instance(fleet: Fleet, tmp_path: Path,
                                                  script_line: str) -> None:
    script = write_script(tmp_path / "s.jsonl", script_line)
    db = str(tmp_path / "budget.db")
    args = ["run", MODERATION, "--input", fleet.inputs[0], "--input", fleet.inputs[1],
            "--db", db, "--llm", f"scripted:{script}", "--budget", "60", "--json"]
    result = invoke(args, fleet.env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    records = json.loads(result.stdout)
    assert len(records) == 2
    # 0 only when all completed, 1 when any failed (e.g. on the budget)
    assert result.exit_code == (0 if all(r["status"] == "completed" for r in records) else 1)
    for r in records:
        assert r["token_budget"] == 60
        assert r["status"] in ("completed", "failed"), r
        if r["status"] == "failed":
            assert r["reason"], r
        else:
            assert r["context"]["result"]["decision"] in ("approve", "reject", "review")
        if script_line is GARBAGE_LINE and r["status"] == "completed":
            assert r["context"]["verdict_source"] in ("rules", "constrained")


def test_run_takes_several_files_after_one_input_flag(tmp_path: Path) -> None:
    """``fsm run M --input A B C`` (the README's glob form) starts one instance per file."""
    script = write_script(tmp_path / "verdict.jsonl", VERDICT_LINE)
    files = inputs(3)
    env: dict[str, str | None] = {"FSM_NOTIFY_FILE": str(tmp_path / "n.jsonl"),
                                  "FSM_NOTIFY_URL": None, "FSM_LLM": None}
    records = ok_json(["run", MODERATION, "--input", *files, "--db", str(tmp_path / "g.db"),
                       "--llm", f"scripted:{script}", "--json"], env)
    assert sorted(r["context"]["path"] for r in records) == sorted(files)
