"""Cases of schedules, idempotent and debounced starts (``testing.case_starts``, issue 38
item 8): a schedule case runs one instance per tick, each checked; a debounced burst makes
one instance with the last input; a repeated key makes one instance; bad specs are one
``InvalidInput`` line naming every fault."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest

from fsm_engine.errors import InvalidInput
from fsm_engine.runtime import schedule_spec as spec
from fsm_engine.store import open_store
from fsm_engine.testing.cases import _check, assert_case, run_case, run_cases
from fsm_engine.testing.export import write_test
from tests.helpers.start_machine import machine

MODULE = "tests/helpers/start_machine.py"
DONE = {"path": ["work", "done"], "status": "completed"}


def _run(tmp_path: Path, case: dict[str, Any], name: str = "starts") -> Any:
    _check(case, "case #0")
    return run_case(machine(name), case, str(tmp_path / "cases.db"))


def _instances(tmp_path: Path) -> list[Any]:
    store = open_store(str(tmp_path / "cases.db"))
    try:
        return store.list()
    finally:
        store.close()


def test_a_schedule_case_of_three_ticks_makes_three_instances_each_checked(
        tmp_path: Path) -> None:
    case = {"name": "every ten seconds", "input": {"n": 4},
            "schedule": {"every": "10s", "ticks": 3}, "instances": 3, **DONE,
            "output": {"total": 4}}
    got = _run(tmp_path, case)
    assert got.ok, got.problems
    assert got.path == ["work", "done"] and got.context["total"] == 4
    made = _instances(tmp_path)
    assert len(made) == 3 and all(r.status == "completed" for r in made)
    keys = sorted(r.start_key for r in made)
    ticks = sorted(spec.parse_tick_id(r.id)[1] for r in made)  # type: ignore[index]
    assert [t - ticks[0] for t in ticks] == [0.0, 10.0, 20.0]  # one per tick, 10 s apart
    assert keys == [spec.tick_key("every-ten-seconds", t) for t in ticks]
    store = open_store(str(tmp_path / "cases.db"))
    try:
        assert store.schedules() == []  # deleted after the case
    finally:
        store.close()


def test_a_cron_schedule_case_fires_on_its_seconds(tmp_path: Path) -> None:
    case = {"name": "cron", "input": {"n": 1}, "output": {"total": 1},
            "schedule": {"cron": "*/5 * * * * *", "tz": "UTC", "ticks": 2,
                         "overlap": "allow", "catchup": "all"}}
    assert _run(tmp_path, case).ok
    ticks = sorted(spec.parse_tick_id(r.id)[1] for r in _instances(tmp_path))  # type: ignore[index]
    assert len(ticks) == 2 and ticks[1] - ticks[0] == 5.0 and ticks[0] % 5 == 0


def test_a_wrong_expectation_of_a_schedule_case_fails_naming_each_tick(tmp_path: Path) -> None:
    case = {"name": "nightly", "input": {"n": 2}, "schedule": {"every": "1h", "ticks": 3},
            "output": {"total": 3}, "instances": 2}
    got = _run(tmp_path, case)
    assert not got.ok
    assert "instances: expected 2, the case's starts made 3" in got.problems
    wrong = [p for p in got.problems if "output total: expected 3, got 2" in p]
    assert len(wrong) == 3, got.problems
    assert all(p.startswith("tick ") and "nightly-2023" in p for p in wrong)
    with pytest.raises(AssertionError, match="output total: expected 3"):
        assert_case(MODULE, case)


def test_cases_sharing_a_store_and_a_name_get_their_own_schedules(tmp_path: Path) -> None:
    case = {"name": "same", "input": {"n": 1}, "schedule": {"every": "10s", "ticks": 2},
            "instances": 2, **DONE}
    results, cov = run_cases(machine(), [case, case])
    assert all(r.ok for r in results), [r.problems for r in results]
    assert cov.instances == 4


def test_a_debounce_burst_of_three_makes_one_instance_with_the_last_input(
        tmp_path: Path) -> None:
    case = {"name": "burst", "debounce": {"key": "user-7", "window_s": 30, "max_wait_s": 120,
                                          "inputs": [{"n": 1}, {"n": 2}, {"n": 3}]},
            "instances": 1, **DONE, "output": {"n": 3, "total": 3}}
    got = _run(tmp_path, case)
    assert got.ok, got.problems
    made = _instances(tmp_path)
    assert len(made) == 1 and made[0].input["n"] == 3 and made[0].debounce_key == "user-7"


def test_a_repeated_key_makes_one_instance(tmp_path: Path) -> None:
    case = {"name": "once", "input": {"n": 5}, "key": "order-42", "instances": 1, **DONE,
            "output": {"total": 5}}
    got = _run(tmp_path, case)
    assert got.ok, got.problems
    made = _instances(tmp_path)
    assert [r.start_key for r in made] == ["order-42"]
    again = _run(tmp_path, {**case, "name": "again"})  # the store still holds the key
    assert any("held by instance" in p for p in again.problems), again.problems


@pytest.mark.parametrize(("case", "needles"), [
    ({"input": {}, "schedule": {"cron": "*/61 * * *"}}, ["'schedule' cron '*/61 * * *'"]),
    ({"input": {}, "schedule": {"cron": "not a cron at all"}}, ["'schedule' cron 'not a cron at all'"]),
    ({"input": {}, "schedule": {"every": "10s", "ticks": 0}},
     ["'ticks' must be an int from 1 to 100"]),
    ({"input": {}, "schedule": {"cron": "nope", "ticks": 0, "tz": "Mars/Olympus",
                                "overlap": "never"}, "key": "k"},
     ["'schedule' cron 'nope'", "'ticks' must be", "'schedule' tz 'Mars/Olympus'", "'schedule' overlap 'never'",
      "no ['key']"]),
    ({"input": {}, "schedule": {"every": "10s", "cron": "* * * * *"}}, ["exactly one of"]),
    ({"input": {}, "schedule": {"every": "soon", "colour": 1}}, ["'schedule' every 'soon'", "colour"]),
    ({"input": {}, "schedule": "10s"}, ["'schedule' must be an object"]),
    ({"input": {}, "debounce": {"key": "", "window_s": 0, "inputs": []}},
     ["'debounce' 'key'", "'window_s' must be", "'inputs' must be", "no ['input']"]),
    ({"debounce": {"key": "k", "window_s": 10, "max_wait_s": 5, "inputs": [{}]}},
     ["'max_wait_s' must be"]),
    ({"input": {}, "key": ""}, ["'key' must be a string"]),
    ({"input": {}, "instances": -1, "priority": 1.5}, ["'instances' must be", "'priority'"]),
])
def test_bad_start_specs_are_refused_in_one_line_naming_every_fault(
        case: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(InvalidInput) as err:
        _check(case, "case #3")
    text = str(err.value)
    assert "\n" not in text and text.startswith("case #3: ")
    for needle in needles:
        assert needle in text, text


def test_a_bad_schedule_case_in_a_cases_file_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli import run_main
    module = tmp_path / "ticking.py"
    module.write_text("from tests.helpers.start_machine import MACHINE  # noqa: F401\n")
    bad = {"input": {}, "schedule": {"cron": "61 * * * *", "ticks": 0}}
    (tmp_path / "ticking_cases.jsonl").write_text(json.dumps(bad) + "\n")
    code, out, err = run_main(["test", str(module)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fsm: error: "), (out, err)
    assert "'schedule' cron" in lines[0] and "'ticks'" in lines[0]


def test_fsm_test_runs_schedule_debounce_and_key_cases(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli import run_main
    module = tmp_path / "ticking.py"
    module.write_text("from tests.helpers.start_machine import MACHINE  # noqa: F401\n")
    cases = [{"name": "ticks", "input": {"n": 1}, "schedule": {"every": "2s", "ticks": 3},
              "instances": 3, **DONE},
             {"name": "burst", "debounce": {"key": "b", "window_s": 5,
                                            "inputs": [{"n": 1}, {"n": 9}]},
              "output": {"total": 9}},
             {"name": "keyed", "input": {"n": 2}, "key": "k-1", **DONE}]
    (tmp_path / "ticking_cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    code, out, err = run_main(["test", str(module)], capsys)
    assert code == 0, out + err
    assert all(f"ok   {c['name']}" in out for c in cases), out


def test_an_exported_test_replays_a_schedule_case(tmp_path: Path) -> None:
    """``fsm export-test``'s file runs its case through ``assert_case``: the new keys
    replay there (passing, then failing on a wrong expectation)."""
    case = {"name": "instance nightly", "input": {"n": 2}, "output": {"total": 2},
            "schedule": {"every": "1d", "ticks": 2}, "instances": 2, **DONE}
    target = tmp_path / "test_case_nightly.py"
    write_test(str(target), case, MODULE)
    runpy.run_path(str(target))["test_case_nightly"]()
    write_test(str(target), {**case, "instances": 3}, MODULE)
    with pytest.raises(AssertionError, match="instances: expected 3"):
        runpy.run_path(str(target))["test_case_nightly"]()


def test_no_tick_after_the_cases_fires_while_its_last_instance_runs(tmp_path: Path) -> None:
    """The schedule is paused as soon as its last tick fired: the first instance's minute of
    ``advance`` fires tick 2 at its time (``overlap: allow``) and no later one (it started
    59 more before)."""
    case = {"name": "allow", "input": {"n": 1}, "decisions": [{"advance": 60}],
            "schedule": {"every": "1s", "ticks": 2, "overlap": "allow"}, **DONE}
    assert _run(tmp_path, case).ok
    assert len(_instances(tmp_path)) == 2
