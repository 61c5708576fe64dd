"""The intersection matrix's export check: every instance a cell ended becomes a test.

After a cell's fault played out and the invariants held, ``check(lab, capsys)`` runs
``fsm export-test ID -o FILE.py`` (``fsm_engine.cli.main`` in-process) for every final
top-level instance of the cell's store (a fan-out parent carries its children; a fork is
top-level), then runs each exported file's test in this process (``runpy``, as
``tests/testing/test_export_kinds.py`` does), so a case is made of what crash recovery
left behind: recovery rows, superseded stream attempts, steps retried after a takeover,
an outbox delivery done before the kill.  Each file must pass, or the export must refuse
in one line with a known reason (``REFUSALS``).  The replays run with the actions' run
log pointed elsewhere and must deliver nothing (``$MATRIX_SINK`` unchanged): a replayed
side effect answers from its recorded result.
"""

from __future__ import annotations

import os
import re
import runpy
from typing import Any

import pytest
from cli import run_main
from matrix_harness import Lab

from fsm_engine.store import FINAL_STATUSES

#: The one-line refusals ``fsm export-test`` may give (``fsm_engine.testing.export``).
REFUSALS = (
    re.compile(r"fsm: error: instance \S+ was cancelled \(history row \d+\): an exported "
               r"test cannot replay when a cancel came"),
    re.compile(r"fsm: error: instance \S+: an operator moved its fan-out child \S+ \(fsm "
               r"send / fsm rerun\), which an exported test does not replay"),
)


def check(lab: Lab, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What went wrong exporting and replaying ``lab``'s final top-level instances (one
    line each, naming the instance; empty: every export passed or refused as it may)."""
    sent = len(lab.deliveries())
    saved = os.environ.get("MATRIX_LOG")
    os.environ["MATRIX_LOG"] = str(lab.tmp / "replayed-runs.jsonl")  # not the cell's runs
    try:
        problems = [p for rec in lab.records()
                    if rec.parent_id is None and rec.status in FINAL_STATUSES
                    for p in _export(lab, rec.id, capsys)]
    finally:
        if saved is None:
            os.environ.pop("MATRIX_LOG", None)
        else:
            os.environ["MATRIX_LOG"] = saved
    if len(lab.deliveries()) != sent:
        problems.append(f"the replays delivered {len(lab.deliveries()) - sent} side "
                        "effect(s) again")
    return problems


def _export(lab: Lab, iid: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    folder = lab.tmp / "exported"
    folder.mkdir(exist_ok=True)
    out_file = folder / ("test_case_" + re.sub(r"[^\w-]", "_", iid) + ".py")
    code, _, err = run_main(["export-test", iid, "-o", str(out_file), "--db", lab.url],
                            capsys)
    if code != 0:
        lines = err.strip().splitlines()
        if code == 2 and len(lines) == 1 and any(r.fullmatch(lines[0]) for r in REFUSALS):
            return []
        return [f"{iid}: export-test exited {code}: {err.strip()}"]
    tests = [fn for name, fn in runpy.run_path(str(out_file)).items()
             if name.startswith("test_") and callable(fn)]
    if len(tests) != 1:
        return [f"{iid}: the exported file holds {len(tests)} tests"]
    return _passes(iid, tests[0], out_file)


def _passes(iid: str, test: Any, out_file: Any) -> list[str]:
    try:
        test()
    except AssertionError as exc:
        return [f"{iid}: its exported test ({out_file}) failed: {exc}"]
    except Exception as exc:  # noqa: BLE001 - any other ending is a finding too, named
        return [f"{iid}: its exported test ({out_file}) raised {type(exc).__name__}: {exc}"]
    return []
