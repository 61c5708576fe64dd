"""What a new user hit on first contact with ``fsm`` (issue 36, "Friction a new user hit"):
a model demanded by a machine that calls none, a sibling import that only
``python -m fsm_engine`` found, ``--set`` text refused by a ``str`` field, ``restart``
speaking of resume, diagram writers disagreeing about folders, a model named twice, and a
closing table without the outcome."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli import MODERATION, VERDICT_LINE, run_main, write_script
from conftest import ROOT

import fsm_engine.llm.select
from fsm_engine.errors import ClientError

PLAIN = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    path: str = ""
    n: int = 0

def count(ctx):
    return {"n": ctx.n + 1}

machine = Machine(name="plain", context=C, initial="count",
                  states=[State("count", action=count), State("done", final=True)],
                  transitions=[Transition("ok", "count", "done")])
'''

MAYBE = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    path: str = ""
    noted: bool = False
    answer: str = ""

def note(ctx, step):                 # takes step, calls no model
    return {"noted": True}

async def ask(ctx, step):            # calls the model
    out = await step.llm.complete([{"role": "user", "content": "hi"}], max_tokens=8)
    return {"answer": out.text}

machine = Machine(name="maybe", context=C, initial="note",
                  states=[State("note", action=note), State("ask", action=ask),
                          State("done", final=True)],
                  transitions=[Transition("ok", "note", "ask"), Transition("ok", "ask", "done")])
'''

WAITING = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    path: str = ""
    label: str = ""
    count: int = 0

machine = Machine(name="labels", context=C, initial="wait",
                  states=[State("wait", wait=True), State("done", final=True)],
                  transitions=[Transition("label", "wait", "done")])
'''

REVIEWED = '''
from pydantic import BaseModel
from fsm_engine import Machine, Review, State, Transition

class Edit(BaseModel):
    label: str = ""

class C(BaseModel):
    path: str = ""
    label: str = ""

machine = Machine(name="reviewed", context=C, initial="check",
                  states=[State("check", review=Review(prompt="ok?", editable=Edit,
                                                       choices=["approve"])),
                          State("done", final=True)],
                  transitions=[Transition("approve", "check", "done")])
'''

FAILING = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    path: str = ""

def boom(ctx):
    raise ValueError("boom")

machine = Machine(name="failing", context=C, initial="boom",
                  states=[State("boom", action=boom), State("done", final=True)],
                  transitions=[Transition("ok", "boom", "done")])
'''


def module(tmp_path: Path, text: str, name: str = "m.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def an_input(tmp_path: Path) -> str:
    path = tmp_path / "in.txt"
    path.write_text("some text to look at\n")
    return str(path)


@pytest.fixture
def llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    monkeypatch.delenv("FSM_NOTIFY_URL", raising=False)
    return ["--llm", f"scripted:{write_script(tmp_path / 'v.jsonl', VERDICT_LINE)}"]


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model spec fails to set up, as the embedded one does without its extra."""
    def refuse(spec, **_):
        raise ClientError("the local extra is not installed")
    monkeypatch.setattr(fsm_engine.llm.select, "provider_from_spec", refuse)


def test_a_machine_that_calls_no_model_runs_without_one(tmp_path, capsys, no_model):
    code, out, err = run_main(["run", module(tmp_path, PLAIN), "--input", an_input(tmp_path),
                               "--db", str(tmp_path / "x.db")], capsys)
    assert code == 0, err
    assert "llm: none (no state calls a model)" in err
    assert "completed" in out


def test_a_state_calling_a_missing_model_fails_naming_why(tmp_path, capsys, no_model):
    db = str(tmp_path / "x.db")
    code, out, err = run_main(["run", module(tmp_path, MAYBE), "--input", an_input(tmp_path),
                               "--db", db, "--json"], capsys)
    assert code == 1, err
    [rec] = json.loads(out)
    assert rec["status"] == "failed" and rec["context"]["noted"] is True  # note ran
    assert "unavailable: the local extra is not installed" in rec["last_error"]


class Unloadable:
    """A local-like model whose load (before the run) fails; counts calls it was asked."""

    name, model, calls = "local", "tiny", 0

    async def load(self) -> None:
        raise ClientError("model file not found: tiny.gguf")

    async def complete(self, messages, **kwargs):
        Unloadable.calls += 1
        raise AssertionError("an unloaded model was called")

    async def aclose(self) -> None:
        return None


def test_a_model_that_fails_to_load_fails_only_the_state_calling_it(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setattr(fsm_engine.llm.select, "provider_from_spec", lambda spec, **_: Unloadable())
    code, out, err = run_main(["run", module(tmp_path, MAYBE), "--input", an_input(tmp_path),
                               "--db", str(tmp_path / "x.db"), "--json"], capsys)
    assert code == 1, err
    [rec] = json.loads(out)
    assert rec["status"] == "failed" and rec["context"]["noted"] is True
    assert "model file not found: tiny.gguf" in rec["last_error"] and Unloadable.calls == 0
    assert "unavailable: model file not found" in err  # the header says so


@pytest.mark.slow  # four fsm processes
@pytest.mark.parametrize("entry", ["fsm", "python -m fsm_engine"])
def test_a_machine_importing_a_sibling_runs_by_either_entry_point(tmp_path, entry, llm):
    script = Path(sys.executable).with_name("fsm")
    if entry == "fsm" and not script.exists():
        pytest.skip("no fsm script beside this interpreter")
    folder = tmp_path / "machines"
    folder.mkdir()
    (folder / "helper.py").write_text("START = 41\n")
    module(folder, PLAIN.replace("def count(ctx):", "from helper import START\n\ndef count(ctx):")
           .replace("ctx.n + 1", "START + 1"), "sib.py")
    argv = [str(script)] if entry == "fsm" else [sys.executable, "-m", "fsm_engine"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cwd in (folder, tmp_path):  # in the module's folder (python -m had it), elsewhere
        rel = os.path.relpath(folder / "sib.py", cwd)
        done = subprocess.run([*argv, "run", rel, "--input", an_input(tmp_path), "--db",
                               str(tmp_path / f"{cwd.name}.db"), "--json", *llm],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["context"]["n"] == 42


def test_only_a_named_machine_file_puts_its_folder_on_sys_path(tmp_path, monkeypatch):
    from fsm_engine.runtime import load_machine
    from fsm_engine.runtime.loader import reference
    monkeypatch.setattr(sys, "path", list(sys.path))
    stored = tmp_path / "stored"
    stored.mkdir()
    load_machine(module(stored, PLAIN.replace('"plain"', '"stored"')))  # as from the store
    assert str(stored) not in sys.path
    named = tmp_path / "named"
    named.mkdir()
    load_machine(module(named, PLAIN.replace('"plain"', '"named"')), named=True)
    assert str(named) in sys.path
    sibling = module(named, PLAIN.replace('"plain"', '"sibling"'), "sibling.py")
    assert reference(sibling) != "sibling"  # the added folder never names a stored module


def test_set_reads_each_value_as_its_field_type(tmp_path, capsys):
    db, mod = str(tmp_path / "x.db"), module(tmp_path, WAITING)
    code, out, err = run_main(["run", mod, "--input", an_input(tmp_path), "--db", db, "--json"],
                              capsys)
    assert code == 3, err
    iid = json.loads(out)[0]["id"]
    code, _, err = run_main(["send", iid, "label", "--set", "label=5", "--set", "count=7",
                             "--db", db, "--machines", mod], capsys)
    assert code == 0, err
    code, out, _ = run_main(["show", iid, "--db", db, "--json"], capsys)
    context = json.loads(out)["context"]
    assert (context["label"], context["count"]) == ("5", 7)


def test_a_review_edit_reads_each_value_as_its_field_type(tmp_path, capsys):
    db, mod = str(tmp_path / "x.db"), module(tmp_path, REVIEWED)
    code, out, err = run_main(["run", mod, "--input", an_input(tmp_path), "--db", db, "--json"],
                              capsys)
    assert code == 3, err
    iid = json.loads(out)[0]["id"]
    item = json.loads(run_main(["review", "list", "--db", db, "--json"], capsys)[1])[0]["id"]
    code, _, err = run_main(["review", "decide", item, "approve", "--set", "label=5", "--as", "t",
                             "--db", db, "--machines", mod], capsys)
    assert code == 0, err
    code, out, _ = run_main(["show", iid, "--db", db, "--json"], capsys)
    assert json.loads(out)["context"]["label"] == "5"


def test_an_outcome_naming_no_context_field_is_a_definition_error(tmp_path, capsys, llm):
    mod = module(tmp_path, PLAIN.replace('transitions=[', 'outcome=("nope",), transitions=['))
    code, _, err = run_main(["run", mod, "--input", an_input(tmp_path), "--db",
                             str(tmp_path / "x.db"), *llm], capsys)
    assert code == 2 and "outcome 'nope' is not a field of the context" in err, err
    assert not (tmp_path / "x.db").exists()


def test_a_set_that_fits_no_type_is_still_one_line(tmp_path, capsys):
    db, mod = str(tmp_path / "x.db"), module(tmp_path, WAITING)
    code, out, _ = run_main(["run", mod, "--input", an_input(tmp_path), "--db", db, "--json"],
                            capsys)
    iid = json.loads(out)[0]["id"]
    code, _, err = run_main(["send", iid, "label", "--set", "count=many", "--db", db,
                             "--machines", mod], capsys)
    assert code == 2 and err.startswith("fsm: error: ") and len(err.strip().splitlines()) == 1


def test_restart_speaks_of_restart(tmp_path, capsys):
    db, mod = str(tmp_path / "x.db"), module(tmp_path, FAILING)
    code, _, err = run_main(["run", mod, "--input", an_input(tmp_path), "--db", db], capsys)
    assert code == 1, err
    code, out, _ = run_main(["restart", "--machine", "failing", "--db", db], capsys)
    assert code == 0 and "would restart " in out and "resume" not in out
    code, out, _ = run_main(["restart", "--machine", "failing", "--db", db, "--yes",
                             "--machines", mod], capsys)
    assert code == 0 and out.startswith("restart: 1 changed"), out


def test_every_diagram_writer_creates_its_folders(tmp_path, capsys):
    db = str(tmp_path / "x.db")
    plain = module(tmp_path, PLAIN)
    assert run_main(["run", plain, "--input", an_input(tmp_path), "--db", db], capsys)[0] == 0
    cover = str(ROOT / "tests" / "helpers" / "cover_machine.py")
    for argv, made in (
            (["diagram", plain, "-o", str(tmp_path / "a" / "b" / "d.dot")], "a/b/d.dot"),
            (["coverage", plain, "--db", db, "--diagram", str(tmp_path / "c" / "d" / "c.dot")],
             "c/d/c.dot"),
            (["test", cover, "--diagram", str(tmp_path / "e" / "f" / "t.dot")], "e/f/t.dot")):
        code, _, err = run_main(argv, capsys)
        assert code == 0, err
        assert (tmp_path / made).read_text().startswith("digraph")


def test_a_scripted_model_is_named_once(tmp_path, capsys, llm):
    db = str(tmp_path / "x.db")
    code, out, err = run_main(["run", MODERATION, "--input", an_input(tmp_path), "--db", db,
                               "--json", *llm], capsys)
    assert code == 0, err
    assert "llm: scripted model 'v.jsonl'" in err
    code, out, _ = run_main(["history", json.loads(out)[0]["id"], "--db", db, "--json"], capsys)
    models = [c["model"] for r in json.loads(out) for c in (r.get("detail") or {}).get("llm_calls", [])]
    assert models == ["scripted:v.jsonl"]


def test_the_closing_table_shows_each_outcome(tmp_path, capsys, llm):
    code, out, err = run_main(["run", MODERATION, "--input", an_input(tmp_path), "--db",
                               str(tmp_path / "x.db"), *llm], capsys)
    assert code == 0, err
    assert re.search(r"outcome\s+decision=approve, verdict_source=model", out), out
    code, out, err = run_main(["run", module(tmp_path, PLAIN), "--input", an_input(tmp_path),
                               "--db", str(tmp_path / "y.db"), *llm], capsys)
    assert code == 0, err
    assert re.search(r"outcome\s+done\b", out), out  # no outcome fields: the final state
