"""``fsm export-test`` for every kind of instance (issue 36, items 3 and 4): each test makes
a real instance on the virtual clock, exports it with the CLI and runs the exported file,
which must pass on the machine that made it (or the export refuses with one line).  A
side-effect tool is never run again by an exported test: its recorded result is replayed.
And no stored value can put code into the generated file."""

from __future__ import annotations

import ast
import json
import runpy
from pathlib import Path
from typing import Any

import pytest
from agent_replies import LOOP, calls, final
from cli import run_main
from cooldown_kind import registered
from review_family_source import MACHINE as FAMILY

from fsm_engine.llm.scripted import Scripted
from fsm_engine.runtime import load_machine
from fsm_engine.testing import VirtualClock
from fsm_engine.testing.cases import run_case

HERE = Path(__file__).resolve().parents[1] / "helpers"
EXPORTED = str(HERE / "export_machine.py")
WORDS = str(HERE / "words_machine.py")
AGENT = str(HERE / "agent_machine.py")
COOLDOWN = str(HERE / "cooldown_kind.py")
Q = {"question": "what is 2 + 3?"}


def _engine(tmp_path: Path, replies: list[dict[str, Any]]) -> tuple[VirtualClock, Any, str]:
    vc = VirtualClock()
    db = str(tmp_path / "orig.db")
    llm = Scripted.from_replies(replies) if replies else None
    return vc, vc.engine(db, llm=llm, breaker=None), db


def _export(tmp_path: Path, capsys: pytest.CaptureFixture[str], db: str, iid: str,
            module: str) -> Path:
    out_file = tmp_path / f"test_case_{iid}.py"
    code, out, err = run_main(["export-test", iid, "-o", str(out_file), "--db", db,
                               "--machine", module], capsys)
    assert code == 0, err
    return out_file


def _replay(out_file: Path, iid: str) -> None:
    runpy.run_path(str(out_file))[f"test_case_{iid}"]()


def _case(out_file: Path) -> dict[str, Any]:
    return dict(runpy.run_path(str(out_file))["CASE"])


def test_a_plain_instance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vc, engine, db = _engine(tmp_path, [{"text": "ok", "completion_tokens": 2}])
    iid = engine.start(load_machine(EXPORTED)[0], {"text": "hello"})
    assert vc.run(engine.run(iid)).state == "done"
    engine.close()
    _replay(_export(tmp_path, capsys, db, iid, EXPORTED), iid)


def test_an_instance_of_a_plugin_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kind of step added as a plug-in (issue 37): its timer is replayed on virtual time."""
    with registered():
        vc, engine, db = _engine(tmp_path, [])
        iid = engine.start(load_machine(COOLDOWN)[0], {})
        assert vc.run(engine.run(iid)).status == "waiting"
        vc.advance(31)
        assert vc.run(engine.run(iid)).state == "done"
        engine.close()
        out_file = _export(tmp_path, capsys, db, iid, COOLDOWN)
        assert _case(out_file)["output"]["n"] == 2
        _replay(out_file, iid)


def test_words_that_merely_contain_credential_names_are_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = "sk-" + "a1B2c3D4e5" * 3
    vc, engine, db = _engine(tmp_path, [{"text": "author=Bob; passage=Call me Ishmael"}])
    data = {"text": f"who wrote it? keyboard=qwerty api_key={key} password=hunter2",
            "keyboard": "qwerty"}
    iid = engine.start(load_machine(WORDS)[0], data)
    rec = vc.run(engine.run(iid))
    engine.close()
    assert (rec.state, rec.context["author"]) == ("bob", "Bob")
    out_file = _export(tmp_path, capsys, db, iid, WORDS)
    text = out_file.read_text()
    assert "hunter2" not in text and key not in text  # real credentials stay masked
    case = _case(out_file)
    assert case["replies"][0]["text"] == "author=Bob; passage=Call me Ishmael"
    assert case["output"]["passage"] == "Call me Ishmael"
    assert case["input"]["keyboard"] == "qwerty"
    _replay(out_file, iid)  # before the fix: author=*** took the edge "other"


def _agent_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                   ) -> tuple[VirtualClock, Any, str, str]:
    monkeypatch.setenv("AGENT_SINK", str(tmp_path / "sink.jsonl"))
    replies = [calls(("send_report", {"text": "2+3=5"})), final("5")]
    vc, engine, db = _engine(tmp_path, replies)
    iid = engine.start(load_machine(AGENT + ":approved")[0], Q)
    assert vc.run(engine.run(iid)).status == "waiting"
    return vc, engine, db, iid


def test_an_agent_whose_tool_call_was_approved(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    vc, engine, db, iid = _agent_waiting(tmp_path, monkeypatch)
    engine.decide(engine.reviews(instance_id=iid)[0], "approve", by="ann")
    rec = vc.run(engine.run(iid))
    engine.close()
    assert (rec.state, rec.context["answer"]) == ("answered", "5")
    out_file = _export(tmp_path, capsys, db, iid, AGENT + ":approved")
    assert [d["choice"] for d in _case(out_file)["decisions"]] == ["approve"]
    _replay(out_file, iid)  # before the fix: no decision, the replay stopped waiting
    assert len((tmp_path / "sink.jsonl").read_text().splitlines()) == 1  # approved once


def test_an_agent_whose_tool_call_was_rejected(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    vc, engine, db, iid = _agent_waiting(tmp_path, monkeypatch)
    rec = engine.decide(engine.reviews(instance_id=iid)[0], "reject", by="ann", note="no")
    engine.close()
    assert rec.state == "rejected"
    out_file = _export(tmp_path, capsys, db, iid, AGENT + ":approved")
    assert [d["choice"] for d in _case(out_file)["decisions"]] == ["reject"]
    _replay(out_file, iid)  # before the fix: choice 'rejected' raised ReviewRefused


def test_a_fan_out_parent_whose_children_waited_in_review(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "rf_machine.py"
    module.write_text(FAMILY)
    vc, engine, db = _engine(tmp_path, [])
    iid = engine.start(load_machine(str(module))[0], {"ns": [1, 2, 3]})
    assert vc.run(engine.run(iid)).status == "waiting"
    for kid in engine.store.children(iid):
        (item,) = engine.reviews(instance_id=kid.id)
        engine.decide(item, "reject" if kid.input["n"] == 2 else "approve", by="ann")
    rec = vc.run(engine.run(iid))
    engine.close()
    assert (rec.state, rec.status, rec.reason) == ("fan", "failed", "branch_failed")
    out_file = _export(tmp_path, capsys, db, iid, str(module))
    _replay(out_file, iid)  # before the fix: the children's decisions were left out


def _waiting_in_review(tmp_path: Path) -> tuple[VirtualClock, Any, str, str]:
    replies = [{"text": "a long answer"}, {"text": "ok"}]
    vc, engine, db = _engine(tmp_path, replies)
    iid = engine.start(load_machine(EXPORTED)[0], {"text": "hello"})
    assert vc.run(engine.run(iid)).state == "review"
    return vc, engine, db, iid


def test_an_instance_moved_by_send(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vc, engine, db, iid = _waiting_in_review(tmp_path)
    rec = vc.run(engine.signal(iid, "approve", {"answer": "sent in"}, operator="ops"))
    engine.close()
    assert (rec.state, rec.context["answer"]) == ("done", "sent in")
    out_file = _export(tmp_path, capsys, db, iid, EXPORTED)
    _replay(out_file, iid)  # before the fix: the replay stopped waiting in review


def test_an_instance_rerun_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    replies = [{"text": "ok"}, {"text": "a long answer"}]
    vc, engine, db = _engine(tmp_path, replies)
    iid = engine.start(load_machine(EXPORTED)[0], {"text": "hello"})
    assert vc.run(engine.run(iid)).state == "done"
    engine.rerun(iid, "ask", in_place=True, by="ops")
    assert vc.run(engine.run(iid)).state == "review"
    rec = engine.decide(engine.reviews(instance_id=iid)[0], "reject", by="ann")
    engine.close()
    assert rec.state == "dropped"
    out_file = _export(tmp_path, capsys, db, iid, EXPORTED)
    _replay(out_file, iid)  # before the fix: the replay ended in done, at the first visit


def test_a_side_effect_tool_is_not_run_again_its_result_is_replayed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    log, sink = tmp_path / "tools.jsonl", tmp_path / "sink.jsonl"
    monkeypatch.setenv("AGENT_TOOL_LOG", str(log))
    monkeypatch.setenv("AGENT_SINK", str(sink))
    vc, engine, db = _engine(tmp_path, LOOP)
    iid = engine.start(load_machine(AGENT)[0], Q)
    assert vc.run(engine.run(iid)).context["answer"] == "5"
    engine.close()

    def sent() -> int:
        return [json.loads(x)["tool"] for x in log.read_text().splitlines()].count("send_report")
    assert sent() == 1 and len(sink.read_text().splitlines()) == 1
    out_file = _export(tmp_path, capsys, db, iid, AGENT)
    _replay(out_file, iid)
    assert sent() == 1 and len(sink.read_text().splitlines()) == 1  # never delivered again
    case = _case(out_file)
    [recorded] = case["tool_results"]["research"]
    assert (recorded["tool"], recorded["result"]) == ("send_report", "sent")
    recorded["result"] = "sent (as recorded)"  # what the replay's model is given back
    replay_db = str(tmp_path / "replay.db")
    got = run_case(load_machine(AGENT)[0], case, replay_db)
    assert got.ok, got.problems
    from fsm_engine.store import open_store
    store = open_store(replay_db)
    try:
        [new] = store.list()
        [report] = [h.detail for h in store.history(new.id)
                    if h.detail.get("tool") == "send_report" and h.detail.get("agent") == "call"]
    finally:
        store.close()
    assert report["result"] == "sent (as recorded)"
    assert sent() == 1 and len(sink.read_text().splitlines()) == 1


def test_stored_values_cannot_put_code_into_the_exported_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evil = "'''\"\"\"\\\n{blob}{module}\n__import__('os').system('touch PWNED')  # \x00\u2028"
    vc, engine, db = _engine(tmp_path, [{"text": evil}])
    iid = engine.start(load_machine(WORDS)[0], {"text": evil})
    vc.run(engine.run(iid))
    engine.close()
    out_file = _export(tmp_path, capsys, db, iid, WORDS)
    tree = ast.parse(out_file.read_text())
    for node in tree.body:  # the docstring, imports, two constant assignments, the test
        assert isinstance(node, ast.Expr | ast.Import | ast.ImportFrom | ast.Assign
                          | ast.FunctionDef), ast.dump(node)
        if isinstance(node, ast.Assign):
            value = node.value
            if isinstance(value, ast.Call):  # CASE = json.loads('...')
                assert ast.unparse(value.func) == "json.loads"
                [value] = value.args
            assert isinstance(value, ast.Constant) and isinstance(value.value, str)
    case = _case(out_file)
    assert case["input"]["text"] == evil and case["output"]["reply"] == evil
    _replay(out_file, iid)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_a_replayed_tool_call_with_other_arguments_fails_the_case_and_sends_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "tools.jsonl"
    monkeypatch.setenv("AGENT_TOOL_LOG", str(log))
    vc, engine, db = _engine(tmp_path, LOOP)
    iid = engine.start(load_machine(AGENT)[0], Q)
    vc.run(engine.run(iid))
    engine.close()
    case = _case(_export(tmp_path, capsys, db, iid, AGENT))
    case["tool_results"]["research"][0]["arguments"] = {"text": "something else"}
    got = run_case(load_machine(AGENT)[0], case, str(tmp_path / "replay.db"))
    assert got.problems[0] == (
        "state 'research': tool send_report call 2.2 (visit 1): recorded with arguments "
        '{"text": "something else"}, now {"text": "2+3=5"}'), got.problems
    ran = [json.loads(x)["tool"] for x in log.read_text().splitlines()]
    assert ran.count("send_report") == 1  # the original's only


def test_a_cancelled_instance_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vc, engine, db, iid = _waiting_in_review(tmp_path)
    engine.cancel(iid, operator="ops")
    engine.close()
    target = tmp_path / "t.py"
    code, out, err = run_main(["export-test", iid, "-o", str(target), "--db", db,
                               "--machine", EXPORTED], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"fsm: error: instance {iid} was cancelled (history row 2): an exported test cannot "
        "replay when a cancel came"], err
    assert not target.exists()


CHILDREN_DELIVER = '''
import os
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition
from fsm_engine.definition.fanout import Map


class Item(BaseModel):
    n: int


def notify(ctx):
    with open(os.environ["KIDS_SINK"], "a") as fh:
        fh.write(f"{ctx.n}\\n")
    return {}


item = Machine(name="kid", context=Item, initial="notify", states=[
    State("notify", action=notify, side_effect=True), State("done", final=True)],
    transitions=[Transition("sent", "notify", "done")])


class Job(BaseModel):
    ns: list[int] = []
    got: list = []


machine = Machine(name="kids", context=Job, initial="fan", states=[
    State("fan", fan_out=Map(items="ns", machine=item, item_field="n", into="got")),
    State("done", final=True)],
    transitions=[Transition("joined", "fan", "done")])
'''


def test_children_that_delivered_side_effects_replay_their_recorded_results(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    sink = tmp_path / "kids.txt"
    monkeypatch.setenv("KIDS_SINK", str(sink))
    module = tmp_path / "kids_machine.py"
    module.write_text(CHILDREN_DELIVER)
    vc, engine, db = _engine(tmp_path, [])
    iid = engine.start(load_machine(str(module))[0], {"ns": [1, 2]})
    assert vc.run(engine.run(iid)).state == "done"
    engine.close()
    assert sorted(sink.read_text().splitlines()) == ["1", "2"]
    out_file = _export(tmp_path, capsys, db, iid, str(module))
    case = _case(out_file)
    assert sorted(e["input"]["n"] for e in case["branch_results"]) == [1, 2]
    _replay(out_file, iid)  # before the fix: each child's notify ran (and wrote) again
    assert sorted(sink.read_text().splitlines()) == ["1", "2"]
    for entry in case["branch_results"]:
        entry["results"]["notify"] = []  # a child's recorded result missing: it fails,
    got = run_case(load_machine(str(module))[0], case, str(tmp_path / "r.db"))
    assert not got.ok and sorted(sink.read_text().splitlines()) == ["1", "2"]  # unsent


def test_a_child_moved_by_send_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "rf_machine.py"
    module.write_text(FAMILY)
    vc, engine, db = _engine(tmp_path, [])
    iid = engine.start(load_machine(str(module))[0], {"ns": [1]})
    vc.run(engine.run(iid))
    [kid] = engine.store.children(iid)
    vc.run(engine.signal(kid.id, "approve", {}, operator="ops"))
    assert vc.run(engine.run(iid)).state == "done"
    engine.close()
    target = tmp_path / "t.py"
    code, out, err = run_main(["export-test", iid, "-o", str(target), "--db", db,
                               "--machine", str(module)], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"fsm: error: instance {iid}: an operator moved its fan-out child {kid.id} (fsm send "
        "/ fsm rerun), which an exported test does not replay"], err
    assert not target.exists()


KEYED_TOOL = '''
import os
from pydantic import BaseModel
from fsm_engine import Agent, Machine, State, Transition, tool


class Ctx(BaseModel):
    question: str
    answer: str = ""


class Answer(BaseModel):
    answer: str


@tool(side_effect=True)
def store_value(key: str, value: str) -> str:
    """Store a value under a key (an external effect)."""
    with open(os.environ["STORE_SINK"], "a") as fh:
        fh.write(f"{key}={value}\\n")
    return "stored"


machine = Machine(name="keyed", context=Ctx, initial="work", states=[
    State("work", agent=Agent(tools=[store_value], output=Answer, max_turns=3)),
    State("answered", final=True), State("turns_exhausted", final=True),
    State("budget_exhausted", final=True)],
    transitions=[Transition("done", "work", "answered"),
                 Transition("turns_exhausted", "work", "turns_exhausted"),
                 Transition("budget_exhausted", "work", "budget_exhausted")])
'''


def test_a_side_effect_tool_whose_argument_is_named_key_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    sink = tmp_path / "store.txt"
    monkeypatch.setenv("STORE_SINK", str(sink))
    module = tmp_path / "keyed_machine.py"
    module.write_text(KEYED_TOOL)
    vc, engine, db = _engine(tmp_path, [calls(("store_value", {"key": "colour",
                                                                "value": "blue"})),
                                        final("stored")])
    iid = engine.start(load_machine(str(module))[0], {"question": "remember blue"})
    assert vc.run(engine.run(iid)).state == "answered"
    engine.close()
    out_file = _export(tmp_path, capsys, db, iid, str(module))
    [recorded] = _case(out_file)["tool_results"]["work"]
    assert recorded["arguments"] == {"key": "***", "value": "blue"}  # a field named key
    _replay(out_file, iid)  # before the fix: recorded with other arguments
    assert sink.read_text() == "colour=blue\n"  # delivered once, by the original


def test_a_fan_out_parent_whose_children_were_decided_by_their_sla_timer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "rf_sla_machine.py"
    module.write_text(FAMILY.replace('choices=["approve", "reject"])',
                                     'choices=["approve", "reject"], sla_s=60.0, '
                                     'on_timeout="reject")'))
    vc, engine, db = _engine(tmp_path, [])
    iid = engine.start(load_machine(str(module))[0], {"ns": [1, 2]})
    vc.run(engine.run(iid))
    kids = engine.store.children(iid)
    engine.decide(engine.reviews(instance_id=kids[0].id)[0], "approve", by="ann")
    vc.advance(61)  # the second child's hour passes undecided: its timer rejects
    vc.run(engine.run(kids[1].id))
    rec = vc.run(engine.run(iid))
    engine.close()
    assert (rec.state, rec.status, rec.reason) == ("fan", "failed", "branch_failed")
    out_file = _export(tmp_path, capsys, db, iid, str(module))
    assert {"timeout": True, "input": {"n": 2, "seen": False}} in _case(out_file)["decisions"]
    _replay(out_file, iid)  # before the fix: the export refused (first: left it out)


def test_a_parent_reviewed_after_its_children_were(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tail = '''    State("done", final=True)],
    transitions=[Transition("joined", "fan", "done")])'''
    assert tail in FAMILY
    module = tmp_path / "rf_check_machine.py"
    module.write_text(FAMILY.replace(tail, '''    State("check", review=Review(prompt="all ok?", choices=["accept"])),
    State("done", final=True)],
    transitions=[Transition("joined", "fan", "check"), Transition("accept", "check", "done")])'''))
    vc, engine, db = _engine(tmp_path, [])
    iid = engine.start(load_machine(str(module))[0], {"ns": [1, 2]})
    vc.run(engine.run(iid))
    for kid in engine.store.children(iid):
        engine.decide(engine.reviews(instance_id=kid.id)[0], "approve", by="ann")
    assert vc.run(engine.run(iid)).state == "check"
    rec = engine.decide(engine.reviews(instance_id=iid)[0], "accept", by="bo")
    engine.close()
    assert rec.state == "done"
    out_file = _export(tmp_path, capsys, db, iid, str(module))
    assert _case(out_file)["decisions"][0]["choice"] == "accept"  # the parent's first
    _replay(out_file, iid)  # before the fix: the parent's decision blocked its children's


VERSIONED = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    text: str
    n: int = 0{field}


def work(ctx):
    return {{"n": ctx.n + 1}}


machine = Machine(
    "versioned", context=Ctx, initial="start", version={version}, migrations={migrations},
    states=[State("start", action=work), State("work", action=work), State("done", final=True)],
    transitions=[Transition("next", "start", "work"), Transition("ok", "work", "done")])
'''


def test_an_instance_migrated_mid_run_replays_on_the_new_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import migration_machines as mm
    monkeypatch.setenv("FSM_MACHINES_ROOT", str(tmp_path))
    module = tmp_path / "versioned.py"
    mm.write(module, VERSIONED.format(field="", version=1, migrations="{}"))
    vc, engine, db = _engine(tmp_path, [])
    iid = engine.start(str(module), {"text": "hi"})
    vc.run(engine.step(iid))  # start -> work under version 1
    engine.close()
    mm.write(module, VERSIONED.format(field="\n    lang: str", version=2,
                                      migrations='{2: lambda c: {**c, "lang": "en"}}'))
    engine = vc.engine(db, breaker=None)
    rec = vc.run(engine.run(iid))  # upcast to version 2 (a migration row), then on
    engine.close()
    assert (rec.state, rec.machine_version, rec.context["lang"]) == ("done", 2, "en")
    out_file = _export(tmp_path, capsys, db, iid, str(module))
    assert _case(out_file)["version"] == 1
    _replay(out_file, iid)  # before the fix: input does not fit Ctx: Field required at lang


def test_an_instance_a_timer_edge_moved_before_a_send(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """machines/reminder.py: one reminder (the timer), then the reply (a send): the export's
    decisions let the timer fire first, and its replay takes the same path."""
    module = str(Path(__file__).resolve().parents[2] / "machines" / "reminder.py")
    machine, _ = load_machine(module)
    vc, engine, db = _engine(tmp_path, [])
    iid = engine.start(machine, {})
    vc.run(engine.run(iid))
    vc.advance(24 * 3600 + 1)
    vc.run(engine.run(iid))
    vc.run(engine.signal(iid, "reply", {"answer": "ok"}))
    engine.close()
    out_file = _export(tmp_path, capsys, db, iid, module)
    assert _case(out_file)["decisions"][0] == "timeout"
    _replay(out_file, iid)
