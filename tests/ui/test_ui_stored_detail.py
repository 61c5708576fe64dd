"""The viewer's instance page reads each history row's stored ``detail`` as hostile
(issue 37): junk shows as it is, never as a failed page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tampered_store import Tampered

from fsm_engine.store import open_store
from fsm_engine.store.records import HistoryRow
from fsm_engine.testing.contract_fixtures import record

pytest.importorskip("jinja2")  # (the [ui] extra: the viewer's data module renders with it)
from fsm_engine.ui.data import Viewer  # noqa: E402


def _page(tmp_path: Path, detail: Any) -> list[dict[str, Any]]:
    store = open_store(str(tmp_path / "v.db"), create=True)
    try:
        store.create(record("i"))
        tampered = Tampered(store)
        tampered.rows["i"] = [HistoryRow("i", 1, "start", "start", "go", 1000.0,
                                         detail=detail)]
        return Viewer(tampered).instance("i")["history"]  # type: ignore[arg-type]
    finally:
        store.close()


def test_a_rows_structured_outputs_show_as_stored(tmp_path: Path) -> None:
    [row] = _page(tmp_path, {"structured": [{"raw": "x", "errors": ["e"]}, 5],
                             "raw": "y", "repairs": ["r"]})
    assert row["outputs"] == [{"raw": "x", "errors": ["e"]},
                              {"raw": "y", "errors": None, "repairs": ["r"]}]


@pytest.mark.parametrize("junk", [[1, 2], "text", 5, True, {"structured": 7},
                                  {"structured": "abc"}, {"recovery": [1]}, {"agent": 5}])
def test_a_rows_junk_detail_shows_no_outputs_and_no_note(tmp_path: Path, junk: Any) -> None:
    [row] = _page(tmp_path, junk)
    assert (row["outputs"], row["note"]) == ([], "")
