"""``fsm start``'s start options (issue 38, ``cli.when``): ``--key``, ``--in``/``--at``,
``--debounce-key``/``--debounce``/``--max-wait``, ``--priority``; ``fsm list``/``show``
showing them; every mistake one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli import run_main

from fsm_engine import SqliteStore

MACHINE = str(Path(__file__).resolve().parents[1] / "helpers" / "start_machine.py")


def _input(tmp_path: Path, n: int) -> str:
    path = tmp_path / f"in{n}.json"
    path.write_text(json.dumps({"n": n}))
    return str(path)


def _start(tmp_path: Path, capsys: pytest.CaptureFixture[str], n: int, *flags: str
           ) -> tuple[int, str, str]:
    return run_main(["start", MACHINE, "-i", _input(tmp_path, n), "--db",
                     str(tmp_path / "fsm.db"), *flags], capsys)


def _ids(tmp_path: Path) -> list[str]:
    store = SqliteStore(str(tmp_path / "fsm.db"))
    try:
        return [r.id for r in store.list()]
    finally:
        store.close()


def test_start_with_a_key_twice_prints_the_first_id(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, first, _ = _start(tmp_path, capsys, 1, "--key", "order-42")
    assert code == 0
    code, again, _ = _start(tmp_path, capsys, 1, "--key", "order-42")
    assert (code, again) == (0, first)
    code, out, err = _start(tmp_path, capsys, 2, "--key", "order-42")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("fsm: error: ") and first.strip() in err
    assert _ids(tmp_path) == [first.strip()]


def test_a_delayed_start_is_listed_scheduled_with_its_due_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, iid, _ = _start(tmp_path, capsys, 1, "--in", "10m")
    assert code == 0
    db = str(tmp_path / "fsm.db")
    code, out, _ = run_main(["list", "--db", db, "--status", "scheduled", "--json"], capsys)
    [row] = json.loads(out)
    assert (row["id"], row["status"], row["owner"]) == (iid.strip(), "scheduled", None)
    assert row["due_at"] == row["next_attempt_at"] and row["due_at"] > row["created_at"] + 590
    code, out, _ = run_main(["list", "--db", db, "--wide"], capsys)
    assert "scheduled" in out and "due " in out and "(in 9 min)" in out
    code, out, _ = run_main(["show", iid.strip(), "--db", db], capsys)
    [due] = [line for line in out.splitlines() if line.startswith("due_at: ")]
    assert due.endswith("(in 9 min))")  # the epoch seconds, then the local time and how soon
    code, _, _ = run_main(["cancel", iid.strip(), "--db", db], capsys)
    assert code == 0
    assert SqliteStore(db).get(iid.strip()).status == "cancelled"


def test_start_at_an_aware_time_is_due_then(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, iid, _ = _start(tmp_path, capsys, 1, "--at", "2030-01-01T00:00:00+00:00")
    assert code == 0
    rec = SqliteStore(str(tmp_path / "fsm.db")).get(iid.strip())
    assert (rec.status, rec.next_attempt_at) == ("scheduled", 1893456000.0)


def test_debounced_starts_collapse_into_one_with_the_latest_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = {_start(tmp_path, capsys, n, "--debounce-key", "doc", "--debounce", "30s",
                  "--max-wait", "5m")[1].strip() for n in (1, 2, 3)}
    [iid] = ids
    rec = SqliteStore(str(tmp_path / "fsm.db")).get(iid)
    assert (rec.status, rec.input, rec.debounce_key) == ("scheduled", {"n": 3, "total": 0}, "doc")
    assert rec.debounce_until == pytest.approx(rec.created_at + 300)
    assert _ids(tmp_path) == [iid]


def test_list_sorts_by_priority_in_claim_order(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    low = _start(tmp_path, capsys, 1, "--priority", "-1")[1].strip()
    plain = _start(tmp_path, capsys, 2)[1].strip()
    high = _start(tmp_path, capsys, 3, "--priority", "5")[1].strip()
    code, out, _ = run_main(["list", "--db", str(tmp_path / "fsm.db"), "--sort", "priority",
                             "--json"], capsys)
    rows = json.loads(out)
    assert [(r["id"], r["priority"]) for r in rows] == [(high, 5), (plain, 0), (low, -1)]


@pytest.mark.parametrize(("flags", "words"), [
    (["--in", "-5s"], "a duration is not negative: '-5s'"),
    (["--at", "9999-12-31T23:59+14:00"], "more than 315360000 seconds (10 years) away"),
    (["--in", "soon"], "cannot read duration"),
    (["--at", "2001-01-01T00:00Z"], "has passed"),
    (["--at", "2099-01-01T00:00"], "has no time zone"),
    (["--at", "tomorrow"], "cannot read start time"),
    (["--in", "5m", "--at", "2099-01-01T00:00Z"], "not both"),
    (["--priority", "5000"], "priority is an integer from -1000 to 1000"),
    (["--debounce-key", "d"], "needs both its key and its window"),
    (["--key", ""], "start key is 1 to 200"),
])
def test_bad_start_options_exit_2_in_one_line_writing_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str) -> None:
    code, out, err = _start(tmp_path, capsys, 1, *flags)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("fsm: error: ") and words in err
    assert not (tmp_path / "fsm.db").exists()  # refused before the store was opened


def test_a_bad_start_option_is_named_before_a_missing_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh user's run: ``fsm start M --in -5s`` said "give at least one --input" first."""
    code, out, err = run_main(["start", MACHINE, "--in", "-5s", "--db", str(tmp_path / "fsm.db")],
                              capsys)
    assert (code, out) == (2, "")
    assert err == "fsm: error: a duration is not negative: '-5s'\n"
