"""``fsm coverage``, ``fsm paths``, ``fsm test`` and ``fsm export-test``: exit codes, the
coverage gate, exported tests that pass and then fail naming the first divergent
transition, and bad input as one error line."""

from __future__ import annotations

import asyncio
import json
import runpy
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli import run_main

from fsm_engine import Engine
from fsm_engine.llm.scripted import Scripted
from fsm_engine.testing import VirtualClock
from tests.helpers import cover_machine, export_machine

HERE = Path(__file__).resolve().parents[1] / "helpers"
ROOT = HERE.parents[1]
COVER = str(HERE / "cover_machine.py")


def _store(tmp_path: Path, inputs: list[dict[str, Any]]) -> str:
    db = str(tmp_path / "cov.db")
    engine = Engine(db)
    ids = [engine.start(cover_machine.machine, i) for i in inputs]
    asyncio.run(engine.run_many(ids))
    engine.close()
    return db


def _one_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsm: error: "), err
    assert needle in lines[0], err
    assert "Traceback" not in out + err


def test_fail_under_100_fails_on_a_store_that_never_took_the_fallback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path, [{"n": 12}, {"n": 3}])
    code, out, err = run_main(["coverage", COVER, "--db", db, "--fail-under", "100"], capsys)
    assert code == 1, (out, err)
    assert "measure --fallback--> rescue" in out and "never taken" in out
    assert "under --fail-under 100 %" in err
    code, out, _ = run_main(["coverage", COVER, "--db", db, "--fail-under", "50"], capsys)
    assert code == 0


def test_full_coverage_passes_the_gate_and_draws_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path, [{"n": 12}, {"n": 3}, {"n": -1}])
    dot = tmp_path / "cov.dot"
    code, out, err = run_main(["coverage", COVER, "--db", db, "--json", "--fail-under", "100",
                               "--diagram", str(dot)], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["percent"] == 100.0 and doc["instances"] == 3
    assert doc["unreached_states"] == ["failed"]
    text = dot.read_text()
    assert "entered ×0" in text and "dashed" in text  # the unreached failure state
    assert "⚑ !is_lucky: only False (passed)" in text  # small's guard seen one way only


def test_paths_lists_each_path_and_what_was_seen(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path, [{"n": 12}])
    code, out, _ = run_main(["paths", COVER, "--db", db], capsys)
    assert code == 0
    lines = out.strip().splitlines()
    assert "measure -> large -> done  seen ×1" in lines
    assert "measure -> rescue -> done  never seen" in lines
    assert lines[-1] == "3 path(s)"


def test_fsm_test_runs_the_module_cases(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["test", COVER, "--fail-under", "100"], capsys)
    assert code == 0, (out, err)
    assert out.count("ok   ") == len(cover_machine.CASES)
    assert "edges 6/6 (100.0 %)" in out


def test_fsm_test_fails_a_case_that_goes_elsewhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "wrong.py"
    module.write_text(COVER_TEXT().replace('"final": "failed"', '"final": "done"'))
    code, out, err = run_main(["test", str(module)], capsys)
    assert code == 1
    assert "FAIL refused" in out and "final: expected 'done', got 'failed'" in out
    assert "1 of 4 case(s) failed" in err


def COVER_TEXT() -> str:  # noqa: N802 - the module's text, as a constant would read
    return Path(COVER).read_text()


def _exported_run(tmp_path: Path) -> tuple[str, str]:
    """One instance of the export machine: a failed call, a wordy answer, approved."""
    vc = VirtualClock()
    db = str(tmp_path / "orig.db")
    replies = [{"error": "unavailable"}, {"text": "a long answer", "completion_tokens": 5}]
    engine = vc.engine(db, llm=Scripted.from_replies(replies), breaker=None)
    iid = engine.start(export_machine.machine, {"text": "say something about postgresql://bob:hunter2@db/x"})
    vc.run(engine.run(iid))
    rec = engine.decide(engine.reviews(instance_id=iid)[0], "approve", by="ann")
    engine.close()
    assert rec.state == "done"
    return db, iid


def test_an_exported_test_passes_then_names_the_first_divergent_transition(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, iid = _exported_run(tmp_path)
    original = str(HERE / "export_machine.py")
    out_file = tmp_path / f"test_case_{iid}.py"
    code, out, err = run_main(["export-test", iid, "-o", str(out_file), "--db", db,
                               "--machine", original], capsys)
    assert code == 0, err
    assert "2 recorded replies" in out
    assert "hunter2" not in out_file.read_text()  # the credential in the input is masked
    runpy.run_path(str(out_file))[f"test_case_{iid}"]()  # passes on the original machine
    changed = tmp_path / "export_changed.py"
    shutil.copy(original, changed)
    changed.write_text(changed.read_text().replace("LONGER = 3", "LONGER = 30"))
    text = out_file.read_text().replace(repr(original), repr(str(changed)))
    out_file.write_text(text)
    with pytest.raises(AssertionError) as info:
        runpy.run_path(str(out_file))[f"test_case_{iid}"]()
    assert "transition 1: recorded ask --long--> review, now ask --short--> done" \
        in str(info.value)


def test_bad_input_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path, [{"n": 3}])
    _one_error(*run_main(["export-test", "nosuchid", "-o", str(tmp_path / "t.py"), "--db", db],
                         capsys), "nosuchid")
    assert not (tmp_path / "t.py").exists()
    _one_error(*run_main(["test", str(HERE / "export_machine.py")], capsys), "no CASES")
    _one_error(*run_main(["coverage", str(HERE / "export_machine.py"), "--db", db], capsys),
               "no instances of machine 'exported'")


def test_the_pytest_option_collects_coverage_across_a_session(tmp_path: Path) -> None:
    import subprocess
    import sys
    (tmp_path / "test_some.py").write_text(
        "import asyncio\n"
        "from fsm_engine import Engine\n"
        "from tests.helpers.cover_machine import machine\n\n"
        "def test_small(tmp_path):\n"
        "    e = Engine(str(tmp_path / 'a.db'))\n"
        "    asyncio.run(e.run(e.start(machine, {'n': 3})))\n"
        "    e.close()\n\n"
        "def test_large(tmp_path):\n"
        "    e = Engine(str(tmp_path / 'b.db'))\n"
        "    asyncio.run(e.run(e.start(machine, {'n': 12})))\n"
        "    e.close()\n")
    # one process, whatever this repo's addopts say (-n auto: each xdist worker would report
    # its own share of the session)
    argv = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "fsm_engine.testing.plugin",
            "--fsm-coverage", COVER, str(tmp_path / "test_some.py"), "-p", "no:cacheprovider"]
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([*argv, "--fsm-coverage-fail-under", "100"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert "2 passed" in ran.stdout, ran.stdout + ran.stderr
    assert "2 instance(s); edges 4/6 (66.7 %)" in ran.stdout
    assert "measure --fallback--> rescue  0  never taken" in ran.stdout
    assert ran.returncode == 1  # the tests passed, the coverage gate did not
    ran = subprocess.run([*argv, "--fsm-coverage-fail-under", "60", "--fsm-coverage-diagram",
                          str(tmp_path / "cov")], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stdout
    assert "stroke-dasharray" in (tmp_path / "cov" / "covered.coverage.svg").read_text()


def test_paths_bound_each_cycle(capsys: pytest.CaptureFixture[str]) -> None:
    router = str(ROOT / "machines" / "router.py")
    code, out, _ = run_main(["paths", router], capsys)
    assert code == 0 and out.strip().splitlines() == [
        "draft -> review -> done", "draft -> done", "2 path(s)"]
    code, out, _ = run_main(["paths", router, "--loops", "1", "--json"], capsys)
    found = [" ".join(p["triggers"]) for p in json.loads(out)["paths"]]
    assert found == ["to_review revise to_review accept", "to_review revise finish",
                     "to_review accept", "finish"]


def test_cases_from_a_sibling_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "borrowed.py"
    module.write_text("from tests.helpers.cover_machine import machine  # noqa: F401\n")
    cases = [{"name": "large", "input": {"n": 12}, "final": "done"},
             {"name": "small", "input": {"n": 3}, "path": ["measure", "small", "done"]}]
    (tmp_path / "borrowed_cases.jsonl").write_text("\n".join(map(json.dumps, cases)) + "\n")
    code, out, err = run_main(["test", str(module), "--fail-under", "100"], capsys)
    assert code == 1, out  # two cases: the fallback edge is never taken
    assert out.count("ok   ") == 2 and "edges 4/6" in out
    (tmp_path / "borrowed_cases.jsonl").write_text('{"input": {"n": 1}, "colour": "red"}\n')
    _one_error(*run_main(["test", str(module)], capsys), "unknown key(s) ['colour']")


def test_a_fan_out_run_exports_its_childrens_replies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digest = str(ROOT / "machines" / "digest.py")
    from fsm_engine import load_machine
    machine, _ = load_machine(digest)
    vc = VirtualClock()
    db = str(tmp_path / "orig.db")
    replies = [{"text": '{"title": "Terms", "gist": "What may be done."}'},
               {"text": "no JSON here"}]  # every second answer fails: re-asks, rule notes
    engine = vc.engine(db, llm=Scripted.from_replies(replies), breaker=None)
    iid = engine.start(machine, {"path": "/usr/share/common-licenses/BSD"})
    rec = vc.run(engine.run(iid))
    engine.close()
    assert rec.state == "done"
    out_file = tmp_path / "test_digest_case.py"
    code, _, err = run_main(["export-test", iid, "-o", str(out_file), "--db", db,
                             "--machine", digest], capsys)
    assert code == 0, err
    runpy.run_path(str(out_file))[f"test_case_{iid}"]()  # the children get their replies
    code, out, err = run_main(["coverage", digest + ":section", "--db", db, "--json"], capsys)
    assert code == 0, err  # a branch machine is covered by the children's rows
    doc = json.loads(out)
    assert doc["machine"] == "digest-section" and doc["instances"] == len(rec.context["notes"])


@pytest.mark.parametrize("bad", [
    ('{"input": {}, "decisions": [{"by": "x"}]}', "a decision is"),
    ('{"input": {}, "decisions": "approve"}', "'decisions' must be a list"),
    ('{"input": [1]}', "'input' must be an object"),
    ('{"input": {}, "deadline_s": "soon"}', "'deadline_s' must be a number"),
    ('{"input": {}, "delay_s": -1}', "'delay_s' must be a number > 0"),
    ('{"input": {}, "priority": 1.5}', "'priority' must be an int"),
    ('{"input": {}, "replies": [{"colour": 1}]}', "scripted reply #0"),
    ('[1, 2]', "a case is an object"),
    ('{"input": ', "line 1: not valid JSON"),
    ('{"input": {"n": ' + "[" * 5000 + "]" * 5000 + "}}", "line 1: nests deeper than"),
])
def test_malformed_cases_are_one_error_line(bad: tuple[str, str], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "borrowed.py"
    module.write_text("from tests.helpers.cover_machine import machine  # noqa: F401\n")
    (tmp_path / "borrowed_cases.jsonl").write_text(bad[0] + "\n")
    _one_error(*run_main(["test", str(module)], capsys), bad[1])


def test_an_exported_side_effect_replays_from_its_recorded_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    review = str(HERE / "review_machine.py")
    from fsm_engine import load_machine
    machine, _ = load_machine(review)
    sink = tmp_path / "sink.txt"
    monkeypatch.setenv("REVIEW_SINK", str(sink))  # publish writes its key here
    vc = VirtualClock()
    db = str(tmp_path / "orig.db")
    engine = vc.engine(db)
    iid = engine.start(machine, {"text": "hello"})
    vc.run(engine.run(iid))
    engine.decide(engine.reviews(instance_id=iid)[0], "approve", by="ann")
    rec = vc.run(engine.run(iid))
    engine.close()
    assert rec.state == "done" and len(sink.read_text().splitlines()) == 1
    out_file = tmp_path / "test_review_case.py"
    code, _, err = run_main(["export-test", iid, "-o", str(out_file), "--db", db,
                             "--machine", review], capsys)
    assert code == 0, err
    runpy.run_path(str(out_file))[f"test_case_{iid}"]()
    assert len(sink.read_text().splitlines()) == 1  # the replay delivered nothing again


def test_an_exported_sla_decision_replays_on_the_virtual_clock(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    review = str(HERE / "review_machine.py")
    from fsm_engine import load_machine
    machine, _ = load_machine(review)
    vc = VirtualClock()
    db = str(tmp_path / "orig.db")
    engine = vc.engine(db)
    iid = engine.start(machine, {"text": "hello"})
    vc.run(engine.run(iid))
    vc.advance(3601)  # the review's hour passes undecided
    rec = vc.run(engine.run(iid))
    engine.close()
    assert rec.state == "rejected"
    out_file = tmp_path / "test_sla_case.py"
    code, _, err = run_main(["export-test", iid, "-o", str(out_file), "--db", db,
                             "--machine", review], capsys)
    assert code == 0, err
    assert '"decisions": ["timeout"]' in out_file.read_text()
    runpy.run_path(str(out_file))[f"test_case_{iid}"]()


def test_export_refuses_a_module_the_row_names_outside_the_machines_root(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "elsewhere.py"  # not under the machines root (the current folder)
    shutil.copy(HERE / "cover_machine.py", outside)
    from fsm_engine import load_machine
    machine, _ = load_machine(str(outside))
    db = str(tmp_path / "x.db")
    engine = Engine(db)
    iid = engine.start(machine, {"n": 3})
    asyncio.run(engine.run(iid))
    engine.close()
    target = tmp_path / "t.py"
    _one_error(*run_main(["export-test", iid, "-o", str(target), "--db", db], capsys),
               "not imported")
    assert not target.exists()
    code, _, err = run_main(["export-test", iid, "-o", str(target), "--db", db,
                             "--machine", str(outside)], capsys)
    assert code == 0, err  # named on the command line: trusted


def test_a_case_may_start_delayed_and_with_a_priority(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``delay_s`` starts the case's instance ``scheduled``; the virtual clock makes it due at
    once (issue 38), so the case runs to its end as a plain one does."""
    module = tmp_path / "later.py"
    module.write_text("from tests.helpers.start_machine import MACHINE  # noqa: F401\n")
    case = {"name": "in an hour", "input": {"n": 2}, "delay_s": 3600, "priority": 2,
            "path": ["work", "done"], "status": "completed", "output": {"total": 2}}
    (tmp_path / "later_cases.jsonl").write_text(json.dumps(case) + "\n")
    code, out, err = run_main(["test", str(module)], capsys)
    assert code == 0, out + err
    assert "in an hour" in out
