"""No process imports code a stored row names (finding 6 of issue 19), on both backends.

A row's ``module`` is data anyone who can write the store controls.  Here a row names a
hostile file that writes a marker file when imported.  The viewer (a real ``fsm ui``
process) draws every page from what the store holds — the exported definition written
when the instance was started, and the history — and the commands that must run code
(``migrate``, ``replay``, ``resume``, ``step``, ``fork``, ``worker``) load only modules
named on their command line or under the machines root, refusing the others in one
``fsm: error:`` line (a worker leaves such an instance alone): the marker never appears.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from format13 import undo_14
from procs import stop

from fsm_engine.store import open_store

ENTRY = [sys.executable, "-c", "from fsm_engine.cli import main; main()"]

FLOW = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class Ctx(BaseModel):
    n: int = 0
    out: str = ""

def work(ctx: Ctx) -> dict:
    return {"out": "x" * ctx.n}

def big(ctx: Ctx) -> bool:
    return ctx.n > 0

machine = Machine(
    name="flow", context=Ctx, initial="work",
    states=[State("work", action=work), State("spare_path", action=work),
            State("done", final=True)],
    transitions=[Transition("ok", "work", "done", conditions=big),
                 Transition("small", "work", "spare_path", unless=big),
                 Transition("ok", "spare_path", "done")],
)
'''

HOSTILE = "import os\nopen({marker!r}, 'a').write(str(os.getpid()) + '\\n')\n"


class Setup:
    """A store of ``flow`` instances (one run, one pending) and a hostile module."""

    def __init__(self, tmp: Path, url: str) -> None:
        self.url, self.tmp = url, tmp
        self.project = tmp / "project"  # the cwd and machines root of every command
        (self.project / "machines").mkdir(parents=True)
        (self.project / "machines" / "flow.py").write_text(FLOW)
        evil = tmp / "outside" / "evilpkg"
        evil.mkdir(parents=True)
        self.marker = tmp / "IMPORTED"
        (evil / "__init__.py").write_text("")
        (evil / "evil.py").write_text(HOSTILE.format(marker=str(self.marker)))
        self.evil = str(evil / "evil.py")
        (tmp / "in.json").write_text(json.dumps({"n": 2}))
        self.env = dict(os.environ, FSM_DB=url, FSM_LLM="scripted:" + str(tmp / "r.jsonl"),
                        PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""),
                                                    str(tmp / "outside")]))
        self.env.pop("FSM_MACHINES_ROOT", None)
        (tmp / "r.jsonl").write_text('{"text": "unused"}\n')

    def fsm(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ENTRY, *args], cwd=self.project, env=self.env, text=True,
                              capture_output=True, timeout=timeout)

    def started(self, run: bool) -> str:
        verb = ["run", "--json", "--local"] if run else ["start"]
        verb.append("machines/flow.py")
        done = self.fsm(*verb, "--input", str(self.tmp / "in.json"))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)[0]["id"] if run else done.stdout.split()[0]

    def point(self, iid: str, module: str) -> None:
        """What someone with write access to the store does: the row names ``module``."""
        execute(self.url, "UPDATE instances SET module = ? WHERE id = ?", (module, iid))

    def imported(self) -> bool:
        return self.marker.exists()


def execute(url: str, sql: str, args: tuple[Any, ...]) -> None:
    """Run one statement on the store's database directly, as an attacker with a SQL role
    (or a copy of the file) would."""
    if url.startswith("postgresql"):
        import psycopg
        with psycopg.connect(url) as conn:
            conn.execute(sql.replace("?", "%s"), args)
        return
    import sqlite3
    conn = sqlite3.connect(url)
    with conn:
        conn.execute(sql, args)
    conn.close()


@pytest.fixture
def setup(tmp_path: Path, store_url: str) -> Setup:
    if not store_url.startswith("postgresql"):
        store_url = str(tmp_path / "project.db")
    return Setup(tmp_path, store_url)


HOSTILE_REFS = ("evil", "abs", "dotted", "climb")


def _ref(setup: Setup, kind: str) -> str:
    return {"abs": setup.evil, "dotted": "evilpkg.evil",
            "climb": "machines/../../outside/evilpkg/evil.py",
            "evil": setup.evil + ":machine"}[kind]


# -- the viewer ----------------------------------------------------------------------------
def _serve(setup: Setup) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([*ENTRY, "ui", "--port", "0", "--refresh", "0"], cwd=setup.project,
                            env=setup.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert match, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    return proc, f"http://127.0.0.1:{match.group(1)}"


def test_no_viewer_page_imports_what_a_row_names(setup: Setup) -> None:
    ran, pending = setup.started(run=True), setup.started(run=False)
    setup.point(ran, setup.evil)
    setup.point(pending, "evilpkg.evil")
    proc, base = _serve(setup)
    try:
        pages = ["/", "/?machine=flow", "/?q=x", f"/instances/{ran}", f"/instances/{pending}",
                 f"/instances/{ran}/json", f"/instances/{pending}/json", "/machines/flow",
                 "/machines/flow?status=completed", "/static/style.css"]
        got = {p: httpx.get(base + p, timeout=30) for p in pages}
    finally:
        stop(proc)
    assert not setup.imported(), "a viewer page imported the module a row names"
    assert {p: r.status_code for p, r in got.items()} == {p: 200 for p in pages}
    page = got[f"/instances/{ran}"].text
    assert "<svg" in page and "spare_path" in page  # the stored definition: a state never visited
    assert "spare_path" in got["/machines/flow"].text


def test_an_old_store_without_definitions_draws_the_history_and_says_why(setup: Setup) -> None:
    ran = setup.started(run=True)
    setup.point(ran, setup.evil)
    execute(setup.url, "DELETE FROM definitions WHERE machine = ?", ("flow",))
    proc, base = _serve(setup)
    try:
        page = httpx.get(f"{base}/instances/{ran}", timeout=30).text
        machine = httpx.get(f"{base}/machines/flow", timeout=30).text
    finally:
        stop(proc)
    assert not setup.imported()
    for text in (page, machine):
        assert "no definition of flow" in text and "drawn from the recorded history only" in text
        assert "spare_path" not in text  # never visited, never guessed, never imported
    assert ">work<" in page or "work" in page


# -- the commands that run code --------------------------------------------------------------
def _one_error_line(done: subprocess.CompletedProcess[str], iid: str, ref: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("fsm: error: "), done.stderr
    assert iid in lines[0] and ref in lines[0], lines[0]


@pytest.mark.parametrize("kind", HOSTILE_REFS)
def test_commands_refuse_a_row_module_outside_the_root(setup: Setup, kind: str) -> None:
    pending = setup.started(run=False)
    ref = _ref(setup, kind)
    setup.point(pending, ref)
    for args in (["migrate"], ["migrate", "--yes"], ["replay", pending], ["resume"],
                 ["step", pending], ["fork", pending, "--from-seq", "0"],
                 ["rerun", pending, "--state", "work"]):
        done = setup.fsm(*args)
        assert not setup.imported(), (args, done.stdout, done.stderr)
        _one_error_line(done, pending, ref)
    rec = open_store(setup.url).get(pending)
    assert rec.status == "pending" and rec.seq == 0  # nothing was written


def test_a_worker_without_machines_leaves_such_an_instance_alone(setup: Setup) -> None:
    pending = setup.started(run=False)
    setup.point(pending, setup.evil)
    proc = subprocess.Popen([*ENTRY, "worker", "--poll", "0.05"], cwd=setup.project,
                            env=setup.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        store = open_store(setup.url)
        deadline = time.monotonic() + 60
        while store.get(pending).reason != "machine_unavailable":
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert not setup.imported()
    rec = open_store(setup.url).get(pending)
    assert rec.seq == 0 and rec.owner is None and setup.evil in (rec.last_error or "")
    assert f"instance {pending} left alone" in err and setup.evil in err


def test_the_row_module_loads_when_under_the_root_or_named(setup: Setup) -> None:
    """README usage keeps working: machines under the root resume without options; a module
    recorded outside it runs once it is named on the command line."""
    pending = setup.started(run=False)
    done = setup.fsm("resume", "--json")
    assert done.returncode == 0, done.stderr
    assert open_store(setup.url).get(pending).status == "completed"
    outside = setup.tmp / "elsewhere" / "flow2.py"
    outside.parent.mkdir()
    outside.write_text(FLOW.replace('name="flow"', 'name="flow2"'))
    started = setup.fsm("start", str(outside), "--input", str(setup.tmp / "in.json"))
    iid = started.stdout.split()[0]
    _one_error_line(setup.fsm("resume"), iid, str(outside))
    _one_error_line(setup.fsm("replay", iid), iid, str(outside))
    assert setup.fsm("replay", iid, str(outside)).returncode == 0
    assert setup.fsm("migrate", "--machines", str(outside)).returncode == 0
    _one_error_line(setup.fsm("fork", iid, "--from-seq", "0"), iid, str(outside))
    assert setup.fsm("fork", iid, "--from-seq", "0", "--machines", str(outside)).returncode == 0
    done = setup.fsm("resume", "--machines", str(outside), "--json")
    assert done.returncode == 0, done.stderr
    assert open_store(setup.url).get(iid).status == "completed"  # the fork completed too


# -- the store keeps definitions (format 11) -------------------------------------------------
def test_a_format_10_store_is_migrated_to_keep_definitions(store_url: str) -> None:
    from fsm_engine.store import DefinitionRow
    from fsm_engine.testing.contract import record
    store = open_store(store_url)
    store.create(record("a"))
    store.close()
    execute(store_url, "DROP TABLE definitions", ())  # as fsm_engine at format 10 left it
    execute(store_url, "DROP TABLE stream_rows", ())  # (format 12's)
    execute(store_url, "ALTER TABLE instances DROP COLUMN pause_request", ())  # (13's)
    for sql in undo_14():  # (14's)
        execute(store_url, sql, ())
    execute(store_url, "UPDATE fsm_meta SET value = '10' WHERE key = 'schema_version'", ())
    store = open_store(store_url)  # a writer: migrated forward on open
    try:
        assert store.get("a").state == "start" and store.get_definition("m", 1, "f") is None
        row = DefinitionRow("m", 1, "f", {"name": "m", "states": [{"name": "start"}]}, 1.0)
        store.put_definitions([row])
        assert store.get_definition("m", 1, "f") == row
    finally:
        store.close()


def test_an_engine_keeps_the_export_of_each_machine_it_registers(store_url: str,
                                                                  tmp_path: Path) -> None:
    from fsm_engine import Engine
    from fsm_engine.runtime.loader import load_machine
    (tmp_path / "flow.py").write_text(FLOW)
    machine, ref = load_machine(str(tmp_path / "flow.py"))
    engine = Engine(store_url)
    try:
        cm = engine.register(machine, ref)
        row = engine.store.get_definition("flow", 1, cm.fingerprint)
        assert row is not None and row.export == machine.export()
    finally:
        engine.close()


def test_trust_follows_symlinks_and_refuses_odd_references(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from fsm_engine.errors import MachineRefused
    from fsm_engine.runtime.loader import Trust
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    marker = tmp_path / "IMPORTED"
    (outside / "evil.py").write_text(HOSTILE.format(marker=str(marker)))
    (root / "link.py").symlink_to(outside / "evil.py")
    (root / "ok.py").write_text(FLOW)
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(root))
    monkeypatch.chdir(tmp_path)
    trust = Trust()
    for ref in ("link.py", str(root / "link.py"), "root/../outside/evil.py", "evil\x00.py",
                "os", "no.such.module", "", ":attr"):
        with pytest.raises(MachineRefused, match="not imported"):
            trust.check(ref, "i1")
    trust.check("ok.py", "i1")
    trust.check(str(root / "ok.py") + ":machine", "i1")
    trust.allow(str(outside / "evil.py"))
    trust.check(str(outside / "evil.py"), "i1")  # named explicitly: the program's choice
    assert not marker.exists()


def test_a_hostile_stored_export_is_drawn_as_data_or_not_at_all(setup: Setup) -> None:
    """The stored definition is a row like any other: a page over a malformed one still
    answers, with the reason, and runs nothing."""
    from starlette.testclient import TestClient

    from fsm_engine.ui import create_app
    ran = setup.started(run=True)
    setup.point(ran, setup.evil)
    execute(setup.url, "UPDATE definitions SET export = ? WHERE machine = ?",
            (json.dumps({"name": "flow", "states": [7, {"name": "<b>x</b>"}]}), "flow"))
    store = open_store(setup.url, readonly=True)
    try:
        client = TestClient(create_app(store))
        pages = [client.get(p) for p in (f"/instances/{ran}", "/machines/flow")]
    finally:
        store.close()
    assert [r.status_code for r in pages] == [200, 200]
    assert all("<b>x</b>" not in r.text for r in pages)
    assert not setup.imported()
