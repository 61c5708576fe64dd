"""The matrix's streaming checker (``matrix_stream``) finds what it is there to find: real
streamed runs hold (a short call its history holds, a long one written by batches), and
each invariant broken on purpose in the log the reader reads is named."""

from __future__ import annotations

import asyncio
import builtins
from dataclasses import replace
from pathlib import Path
from typing import Any

import matrix_stream
import pytest
from matrix_harness import Lab
from matrix_kinds import ref

from fsm_engine.llm import Scripted
from fsm_engine.store.streams import StreamRow


class Relogged:
    """A store whose stream log is the real one's, changed by ``edit`` (rows -> rows)."""

    def __init__(self, store: Any, edit: Any) -> None:
        self.store, self.edit = store, edit

    def stream_read(self, iid: str, from_pos: int = 0, limit: int = 500
                    ) -> builtins.list[StreamRow]:
        rows = self.edit(self.store.stream_read(iid, 0, 10_000))
        return [r for r in rows if r.pos >= from_pos][:limit]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[Any, str]:
    lab = Lab(str(tmp_path / "fsm.db"), tmp_path)
    for key in ("MATRIX_LOG", "MATRIX_SINK", "FSM_MACHINES_ROOT"):
        monkeypatch.setenv(key, lab.env[key])
    engine = lab.engine(Scripted(lab.script))
    iid = engine.start(ref(name), {"item": "x"})
    asyncio.run(engine.run(iid))
    return engine, iid


def found(store: Any, iid: str) -> list[str]:
    return matrix_stream.check(store, [store.get(iid)], {iid: store.history(iid)})


@pytest.mark.parametrize("name", ["stream_short", "stream_long"])
def test_a_streamed_run_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              name: str) -> None:
    engine, iid = _ran(tmp_path, monkeypatch, name)
    logged = engine.store.stream_read(iid)
    assert (name == "stream_short") == (logged == [])  # (short: its history holds the rows)
    assert found(engine.store, iid) == []
    engine.close()


def _renumber(rows: list[StreamRow]) -> list[StreamRow]:
    return [replace(r, pos=n) for n, r in enumerate(rows)]


def test_an_attempt_left_open_and_one_that_looks_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, iid = _ran(tmp_path, monkeypatch, "stream_long")
    no_end = Relogged(engine.store, lambda rows: _renumber([r for r in rows if r.kind != "end"]))
    problems = found(no_end, iid)
    assert any("left open" in p and "never superseded" in p for p in problems)
    assert any("last attempt (1, 1)" in p for p in problems)

    def cut(rows: list[StreamRow]) -> list[StreamRow]:  # a chunk lost, the end still there
        chunks = [r for r in rows if r.kind == "chunk"]
        return _renumber([r for r in rows if r is not chunks[-1]])
    assert any("looks complete" in p for p in found(Relogged(engine.store, cut), iid))
    engine.close()


def test_a_gap_a_late_row_and_a_supersession_by_nobody(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, iid = _ran(tmp_path, monkeypatch, "stream_long")
    gap = Relogged(engine.store, lambda rows: [r for r in rows if r.pos != 1])
    assert any("log offsets" in p or "before its open" in p or "chunk at char" in p
               for p in found(gap, iid))

    def superseded(rows: list[StreamRow]) -> list[StreamRow]:  # by (1, 9), then more text
        by = StreamRow(iid, 1, 1, "superseded", info={"by": [1, 9]}, at=rows[0].at)
        return _renumber([rows[0], rows[1], by, *rows[2:]])
    problems = found(Relogged(engine.store, superseded), iid)
    assert any("not opened after it" in p for p in problems)
    assert any("superseded at 2 by (1, 9), then" in p for p in problems)
    engine.close()
