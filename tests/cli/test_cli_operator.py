"""The CLI as an operator's tool: exit codes, 80-column tables, list filters, history
--follow, outbox filters, prune (dry run, batches, no orphan rows), check (planted gap and
state mismatch), --version, help on every option, and diagram --stats."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import typer
from conftest import HELPERS, MACHINES, license_files, scripted
from observe_fixtures import Fleet, hold_and_die
from typer.testing import CliRunner

from fsm_engine import Engine, SqliteStore, load_machine
from fsm_engine.cli import app
from fsm_engine.cli.observe import _fsm_command
from fsm_engine.cli.tables import COLUMNS
from fsm_engine.store import InstanceFilter

ENTRY = [sys.executable, "-c", "from fsm_engine.cli import main; main()"]
ROUTER = str(MACHINES / "router.py")
MODERATION = str(MACHINES / "moderation.py")
runner = CliRunner()

WAITING = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    n: int = 0

machine = Machine(name="holds", context=C, initial="start",
                  states=[State("start"), State("hold", wait=True), State("done", final=True)],
                  transitions=[Transition("go", "start", "hold"), Transition("release", "hold", "done")])
'''


def invoke(*args: str, env: dict[str, str] | None = None) -> object:
    return runner.invoke(app, list(args), env=env)


def copy_db(fleet: Fleet, tmp_path: Path) -> str:
    """A private copy of the session fleet (for tests that change the database)."""
    target = tmp_path / "copy.db"
    src = sqlite3.connect(fleet.db)
    dst = sqlite3.connect(target)
    src.backup(dst)
    src.close()
    dst.close()
    return str(target)


def script(tmp_path: Path, *replies: dict) -> str:
    path = tmp_path / "script.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in replies))
    return f"scripted:{path}"


# -- exit codes ----------------------------------------------------------------------------
def test_run_exit_codes_completed_failed_and_not_final(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    files = license_files(1)
    verdict = script(tmp_path, {"text": json.dumps({"decision": "approve", "categories": [],
                                                    "summary": "ok"})})
    ok = invoke("run", MODERATION, "--input", *files, "--db", str(tmp_path / "a.db"),
                "--llm", verdict, "-q")
    assert ok.exit_code == 0, ok.output
    topic = tmp_path / "topic.json"
    topic.write_text("{}")
    looping = script(tmp_path, {"text": "to_review"}, {"text": "revise"})
    failed = invoke("run", ROUTER, "--input", str(topic), "--db", str(tmp_path / "b.db"),
                    "--llm", looping, "-q")
    assert failed.exit_code == 1, failed.output
    holds = tmp_path / "holds.py"
    holds.write_text(WAITING)
    waiting = invoke("run", str(holds), "--input", str(topic), "--db", str(tmp_path / "c.db"),
                     "--llm", looping, "-q")
    assert waiting.exit_code == 3, waiting.output
    assert "waiting" in waiting.stdout


def test_wait_exit_codes_completed_failed_and_not_final(tmp_path: Path, monkeypatch) -> None:
    """``fsm wait`` on a SQLite store: 0 all completed, 1 any failed, 3 any still not final
    (here: one waiting for an event)."""
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    db = str(tmp_path / "w.db")
    topic = tmp_path / "topic.json"
    topic.write_text("{}")
    holds = tmp_path / "holds.py"
    holds.write_text(WAITING)
    done, failed, waiting = [
        json.loads(invoke("run", module, "--input", str(topic), "--db", db, "--llm",
                          script(tmp_path, *replies), "--json").stdout)[0]["id"]
        for module, replies in ((ROUTER, [{"text": "finish"}]),
                                (ROUTER, [{"text": "to_review"}, {"text": "revise"}]),
                                (str(holds), [{"text": "unused"}]))]
    assert invoke("wait", done, "--db", db, "-q").exit_code == 0
    assert invoke("wait", done, failed[:8], "--db", db, "-q").exit_code == 1
    late = invoke("wait", done, waiting, "--db", db, "--timeout", "0.2", "-q")
    assert late.exit_code == 3 and "waiting" in late.stdout  # settled, not final


def test_run_ends_with_the_command_that_opens_the_viewer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    monkeypatch.delenv("FSM_DB", raising=False)
    topic = tmp_path / "topic.json"
    topic.write_text("{}")
    looping = script(tmp_path, {"text": "to_review"}, {"text": "revise"})
    db = str(tmp_path / "odd name [1].db")
    shown = invoke("run", ROUTER, "--input", str(topic), "--db", db, "--llm", looping)
    assert shown.exit_code == 1, shown.output  # failed (loop_limit): the hint all the same
    # not a terminal (a log): a line per instance that ended instead of a progress bar
    assert re.search(r"^fsm: 1/1 \w+ failed \(loop_limit\)$", shown.stderr, re.M), shown.stderr
    last = shown.stdout.strip().splitlines()[-1]
    assert last == f"view: {_fsm_command()} ui --db '{db}'"
    for quiet in (["-q"], ["--json"]):
        result = invoke("run", ROUTER, "--input", str(topic), "--db", db, "--llm", looping,
                        *quiet)
        assert "view:" not in result.stdout
    monkeypatch.chdir(tmp_path)
    default = invoke("run", ROUTER, "--input", str(topic), "--llm", looping)
    assert default.stdout.strip().splitlines()[-1] == f"view: {_fsm_command()} ui --db fsm.db"
    monkeypatch.setenv("FSM_DB", "sqlite:///env.db")
    env = invoke("run", ROUTER, "--input", str(topic), "--llm", looping)
    assert env.stdout.strip().splitlines()[-1] == \
        f"view: {_fsm_command()} ui --db sqlite:///env.db"
    assert (tmp_path / "env.db").exists()


def test_the_viewer_hint_names_this_fsm_as_it_can_be_called_again(tmp_path: Path,
                                                                   monkeypatch) -> None:
    script_path = tmp_path / "venv" / "bin" / "fsm"
    script_path.parent.mkdir(parents=True)
    script_path.write_text("#!/bin/sh\n")
    script_path.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script_path), "run"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a venv that was not activated
    assert _fsm_command() == "venv/bin/fsm"
    monkeypatch.setenv("PATH", f"{script_path.parent}:/usr/bin:/bin")  # activated
    assert _fsm_command() == "fsm"
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "cli.py")])  # python -m fsm_engine.cli
    assert _fsm_command().endswith(" -m fsm_engine.cli")


def test_a_takeover_reads_in_history_and_is_no_step_in_stats(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    iid, gone = hold_and_die(db, ROUTER)  # SIGKILLed holding it: the next run takes it over
    assert invoke("resume", "--db", db, "--llm",
                  script(tmp_path, {"text": "finish"}), "-q").exit_code == 0
    rows = json.loads(invoke("history", iid, "--db", db, "--json").stdout)
    kinds = [r["kind"] for r in rows]
    assert kinds[0] == "recovery" and kinds[1:] == ["transition"] * (len(rows) - 1) != []
    info = rows[0]["detail"]["recovery"]
    assert (info["from"], info["cause"], info["status"], info["mid_step"]) == (
        gone, "process_gone", "pending", False)
    table = invoke("history", iid, "--db", db, env={"COLUMNS": "200"}).stdout
    host, pid = gone.split(":")[:2]
    assert f"from {host} pid {pid}" in table and "while pending" in table
    stats = json.loads(invoke("stats", "--db", db, "--json").stdout)
    figures = stats["router"]
    steps = sum(st["steps"] for st in figures["states"].values())
    assert steps == len(rows) - 1 and figures["states"][rows[0]["source"]]["recoveries"] == 1
    assert all(e["kind"] != "recovery" for e in figures["edges"])
    rec = SqliteStore(db)
    try:
        assert (rec.get(iid).loop_count, rec.get(iid).seq) == (len(rows) - 1, len(rows))
    finally:
        rec.close()


def test_resume_exit_codes(tmp_path: Path) -> None:
    db = str(tmp_path / "r.db")
    hold_and_die(db, ROUTER)  # its worker is gone: the pending instance is orphaned
    shown = json.loads(invoke("list", "--db", db, "--status", "orphaned", "--json").stdout)
    assert [r["shown_status"] for r in shown] == ["orphaned"]
    looping = script(tmp_path, {"text": "revise"})
    assert invoke("resume", "--db", db, "--llm", looping, "-q").exit_code == 1
    nothing = invoke("resume", "--db", db, "--llm", looping, "-q")
    assert nothing.exit_code == 0 and "nothing to resume" in nothing.stdout
    engine = Engine(db)
    machine, ref = load_machine(ROUTER)
    engine.register(machine, ref)
    engine.start(machine, {})
    engine.close()  # given back: resumed as a pending instance
    finish = script(tmp_path, {"text": "finish"})
    assert invoke("resume", "--db", db, "--llm", finish, "-q").exit_code == 0


def test_resume_counts_the_instances_it_resumes_in_its_log_lines(tmp_path: Path) -> None:
    db = str(tmp_path / "r.db")
    iid, _ = hold_and_die(db, ROUTER)
    shown = invoke("resume", "--db", db, "--llm", script(tmp_path, {"text": "finish"}))
    assert shown.exit_code == 0, shown.output
    assert re.search(rf"^fsm: 1/1 {iid} completed$", shown.stderr, re.M), shown.stderr


# -- tables and list -----------------------------------------------------------------------
@pytest.mark.parametrize("columns", ["80", "60", "200"])
def test_list_keeps_every_header_and_fits_the_terminal(fleet: Fleet, columns: str) -> None:
    result = invoke("list", "--db", fleet.db, env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= int(columns)
    for header, _, _ in COLUMNS:
        assert header in result.stdout, header
    assert "…" not in result.stdout
    assert result.stdout.count("completed") == 7 and result.stdout.count("loop_limit") == 2
    assert re.search(r"\d\d:\d\d:\d\d \((\d+ (s|min|h|d) ago|just now)\)", result.stdout)


def test_list_wide_is_a_table_at_any_width(fleet: Fleet) -> None:
    result = invoke("list", "--db", fleet.db, "--wide", env={"COLUMNS": "80"})
    header = next(line for line in result.stdout.splitlines() if "last error" in line)
    assert all(h in header for h, _, _ in COLUMNS)


def ids(fleet: Fleet, *args: str) -> list[str]:
    result = invoke("list", "--db", fleet.db, "--json", *args)
    assert result.exit_code == 0, result.output
    return [r["id"] for r in json.loads(result.stdout)]


def test_list_filters_and_paging(fleet: Fleet) -> None:
    store = SqliteStore(fleet.db, readonly=True)
    every = [r.id for r in store.list()]
    newest = store.list()[-1].created_at
    store.close()
    assert ids(fleet) == every
    assert ids(fleet, "--machine", "router") == fleet.ids["router"]
    assert ids(fleet, "--reason", "loop_limit") == fleet.ids["router"]
    assert ids(fleet, "--status", "failed", "--status", "completed") == every
    assert ids(fleet, "--state", "failed", "-m", "router") == fleet.ids["router"]
    assert ids(fleet, "--text", fleet.ids["quoted"][0][:7]) == fleet.ids["quoted"]
    assert ids(fleet, "--limit", "3") == every[:3]
    assert ids(fleet, "--limit", "3", "--offset", "3") == every[3:6]
    assert ids(fleet, "--newest", "--limit", "1") == every[-1:]
    assert ids(fleet, "--sort", "tokens", "--newest", "--limit", "1") in \
        ([i] for i in fleet.ids["moderation"])
    assert ids(fleet, "--since", "1h") == every
    assert ids(fleet, "--until", "2000-01-01") == []
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(newest + 1))
    assert ids(fleet, "--since", since) == []
    bad = invoke("list", "--db", fleet.db, "--since", "yesterday-ish")
    assert bad.exit_code != 0


def test_list_json_keeps_epoch_and_iso_times(fleet: Fleet) -> None:
    [row] = json.loads(invoke("list", "--db", fleet.db, "--json", "--limit", "1").stdout)
    assert isinstance(row["created_at"], float) and row["shown_status"] == "completed"


def test_outbox_filters(fleet: Fleet) -> None:
    one = fleet.ids["moderation"][0]
    rows = json.loads(invoke("outbox", "--db", fleet.db, "--json", "--instance", one[:6]).stdout)
    assert [r["instance_id"] for r in rows] == [one]
    done = json.loads(invoke("outbox", "--db", fleet.db, "--json", "--status", "done").stdout)
    assert len(done) == 6
    assert json.loads(invoke("outbox", "--db", fleet.db, "--json", "--status", "pending").stdout) == []


# -- history --follow ----------------------------------------------------------------------
def test_history_follow_prints_every_row_once_until_final(tmp_path: Path) -> None:
    db = str(tmp_path / "f.db")
    engine = Engine(db, llm=scripted({"text": "to_review", "delay_s": 0.02},
                                     {"text": "revise", "delay_s": 0.02}))
    machine, ref = load_machine(ROUTER)
    engine.register(machine, ref)
    iid = engine.start(machine, {})
    follow = subprocess.Popen([*ENTRY, "history", iid, "--db", db, "--follow", "--json",
                               "--interval", "0.05"], stdout=subprocess.PIPE, text=True)

    async def go():
        try:
            return await engine.run(iid)
        finally:
            await engine.aclose()
    rec = asyncio.run(go())
    out, _ = follow.communicate(timeout=60)
    assert follow.returncode == 0
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["seq"] for r in rows] == list(range(1, rec.seq + 1))
    assert "failed in state failed" in out


# -- prune and check -----------------------------------------------------------------------
def table_counts(db: str) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("instances", "history", "attempts", "outbox")}
    finally:
        conn.close()


def test_prune_is_a_dry_run_unless_yes_and_leaves_no_orphans(fleet: Fleet, tmp_path: Path) -> None:
    db = copy_db(fleet, tmp_path)
    before = table_counts(db)
    dry = invoke("prune", "--db", db, "--older-than", "0s", "--status", "failed", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout) == {"matching": 2, "deleted": 0,
                                                             "skipped": 0, "dry_run": True}
    assert table_counts(db) == before
    assert json.loads(invoke("prune", "--db", db, "--older-than", "30d", "--yes",
                             "--json").stdout)["deleted"] == 0  # nothing that old
    real = invoke("prune", "--db", db, "--older-than", "0s", "--yes", "--batch", "2", "--json")
    assert json.loads(real.stdout) == {"matching": 9, "deleted": 9, "skipped": 0,
                                       "dry_run": False}
    assert table_counts(db) == {"instances": 0, "history": 0, "attempts": 0, "outbox": 0}
    assert invoke("check", "--db", db).exit_code == 0
    bad = invoke("prune", "--db", db, "--older-than", "0s", "--status", "running")
    assert bad.exit_code == 2 and "ended instances only" in bad.output


def test_prune_keeps_unfinished_instances(fleet: Fleet, tmp_path: Path) -> None:
    db = copy_db(fleet, tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE instances SET status='running' WHERE machine='quoted'")
    conn.commit()
    conn.close()
    invoke("prune", "--db", db, "--older-than", "0s", "--yes")
    assert [r.machine for r in SqliteStore(db).list()] == ["quoted"]


def test_check_finds_a_planted_gap_and_a_state_mismatch(fleet: Fleet, tmp_path: Path) -> None:
    db = copy_db(fleet, tmp_path)
    healthy = invoke("check", "--db", db)
    assert healthy.exit_code == 0 and "ok" in healthy.stdout
    gap, odd = fleet.ids["moderation"][0], fleet.ids["router"][0]
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM history WHERE seq = 3 AND instance = "
                 "(SELECT key FROM instances WHERE id = ?)", (gap,))
    conn.execute("UPDATE instances SET state = 'draft' WHERE id = ?", (odd,))
    conn.commit()
    conn.close()
    result = invoke("check", "--db", db, "--json")
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    # the backend's two, and the runtime's: the deleted row's delta is missing from a replay
    assert len(problems) == 3, problems
    assert any(gap in p and "does not replay" in p for p in problems)
    assert any(gap in p and "gap" in p for p in problems)
    assert any(odd in p and "'draft'" in p and "'failed'" in p for p in problems)


# -- version, help, diagram --stats --------------------------------------------------------
def test_version() -> None:
    from fsm_engine import __version__
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"fsm_engine {__version__}"


def test_every_option_has_help_and_no_type_tags() -> None:
    root = typer.main.get_command(app)
    commands = root.commands  # type: ignore[attr-defined]
    assert {"run", "list", "stats", "ui", "prune", "check", "history", "outbox"} <= set(commands)
    for name, command in commands.items():
        for param in command.params:
            if getattr(param, "param_type_name", "") == "option" and param.name != "help":
                assert param.help, f"fsm {name} {param.opts[0]} has no help"
        text = invoke(name, "--help", env={"COLUMNS": "80"}).stdout
        assert "<bool>" not in text, name


def test_diagram_stats_counts_equal_the_store(fleet: Fleet, tmp_path: Path) -> None:
    if shutil.which("dot") is None:
        pytest.skip("needs graphviz")
    store = SqliteStore(fleet.db, readonly=True)
    taken = Counter(h.trigger for r in store.list(machine="moderation")
                    for h in store.history(r.id))
    now = store.count(InstanceFilter(machine="moderation"), "state")
    store.close()
    out = tmp_path / "agg.dot"
    result = invoke("diagram", MODERATION, "--stats", "--db", fleet.db, "-o", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    for trigger, n in taken.items():
        assert re.search(rf'label="{re.escape(trigger)}[^"]* ×{n}"', text), trigger
    for _state, n in now.items():
        assert f"now {n}" in text
    assert invoke("diagram", MODERATION, "--stats", "--db", fleet.db, "-o",
                  str(tmp_path / "agg.svg")).exit_code == 0
    assert (tmp_path / "agg.svg").read_text().lstrip().startswith("<?xml")
    one = fleet.ids["moderation"][1]
    result = invoke("diagram", MODERATION, "--instance", one, "--db", fleet.db)
    assert "attempt" in result.stdout and " s" in result.stdout
    both = invoke("diagram", MODERATION, "--instance", one, "--stats", "--db", fleet.db)
    assert both.exit_code == 2 or "not both" in both.output


def test_unless_guards_read_naturally() -> None:
    from fsm_engine.views import guard_reading
    assert guard_reading("has_text", True) == ("has_text", True)
    assert guard_reading("!has_text", True) == ("not has_text", False)  # the unless blocked
    assert guard_reading("!has_text", False) == ("not has_text", True)


def test_history_shows_pause_rows_as_a_pause_and_its_end_not_as_an_error(tmp_path: Path) -> None:
    """Issue 36 (friction): the last column of ``fsm history`` showed a pause row's reason
    (``paused``) as if it were an error; it now says who paused it and why, and who ended
    the pause after how long, in a column named for notes and errors alike."""
    db = str(tmp_path / "p.db")
    eng = Engine(db, llm=None)
    [iid] = eng.start_many(load_machine(str(HELPERS / "console_machine.py"))[0], [{}],
                           enqueue=True)
    eng.pause(iid, by="ann", reason="paused")
    eng.unpause(iid, by="bob")
    eng.close()
    table = invoke("history", iid, "--db", db, env={"COLUMNS": "200"}).stdout
    pause, unpause = (next(line for line in table.splitlines() if f"│ {kind} " in line)
                      for kind in ("pause", "unpause"))
    assert "paused by ann: paused" in pause
    assert "unpaused by bob after" in unpause
    header = next(line for line in table.splitlines() if "trigger" in line)
    assert "note" in header and " error " not in header
