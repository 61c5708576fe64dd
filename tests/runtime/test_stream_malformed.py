"""A malformed stream row (issue 36 item 12): a value of the wrong type where the log holds
a number, an object or a known kind is reported by every reader — ``engine.stream`` raises
``StoreError`` naming the row, ``fsm stream`` prints one ``fsm: error:`` line, the viewer's
SSE response ends with one ``fsm-error`` event — never a traceback or a cut response; and
a stream offset past the end of the log is refused the same way."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest
from cli import run_main
from streamed_machine import CHUNKS, machine, run

from fsm_engine import Engine
from fsm_engine.errors import StoreError
from fsm_engine.llm.scripted import Scripted
from fsm_engine.store.streams import StreamOp, StreamRow

SLOW = [{"chunks": CHUNKS, "chunk_delay_s": 0.03}]  # (slower than a batch: the log is written)


def collect(engine: Engine, iid: str) -> list[Any]:
    async def go() -> list[Any]:
        return [ev async for ev in engine.stream(iid)]
    return asyncio.run(go())


@pytest.mark.parametrize("change", [
    "char_offset = 'x'", "attempt = 'q'", "at = 'q'", "text = x'ff00'", "pos = 'x'",
    "info = '[1, 2]'", "info = '{\"by\": [[1], 2]}'", "kind = 'zzz'", "seq = -4"])
def test_fsm_stream_reports_a_malformed_row_in_one_line(db_path, capsys, change: str) -> None:
    engine = Engine(db_path, llm=Scripted.from_replies(SLOW), seed=1)
    iid, _ = run(engine, machine())
    engine.close()
    with sqlite3.connect(db_path) as conn:
        pos = conn.execute("SELECT MAX(pos) FROM stream_rows").fetchone()[0]
        conn.execute(f"UPDATE stream_rows SET {change} WHERE pos = ?", (pos,))
    code, out, err = run_main(["stream", iid, "--db", db_path], capsys)
    lines = err.strip().splitlines()
    assert (code, len(lines)) == (2, 1), err
    assert lines[0].startswith(f"fsm: error: instance {iid}: stream row") and "malformed" in lines[0]
    assert "".join(CHUNKS)[:3] in out  # what came before the bad row was shown


def test_a_malformed_row_is_a_store_error_on_both_backends(engine_factory) -> None:
    engine = engine_factory(llm=Scripted.from_replies(SLOW), seed=1)
    iid, _ = run(engine, machine())
    good = [e.kind for e in collect(engine, iid)]
    for bad in (StreamRow(iid, 1, 1, "superseded", info={"by": [[1], 2]}),
                StreamRow(iid, 1, 1, "zzz")):
        engine.store.stream_write([StreamOp(iid, (bad,))])
        with pytest.raises(StoreError, match=rf"instance {iid}: stream row \d+ is malformed"):
            collect(engine, iid)
    assert good[-1] == "final"


def test_the_viewer_ends_a_stream_at_a_malformed_row_with_one_error_event(db_path) -> None:
    from starlette.testclient import TestClient

    from fsm_engine.store import open_store
    from fsm_engine.ui import create_app
    engine = Engine(db_path, llm=Scripted.from_replies(SLOW), seed=1)
    iid, _ = run(engine, machine())
    engine.store.stream_write([StreamOp(iid, (StreamRow(iid, 1, 1, "chunk", offset=-7),))])
    engine.close()
    store = open_store(db_path, readonly=True)
    try:
        with TestClient(create_app(store)) as client:
            body = client.get(f"/instances/{iid}/stream").text
    finally:
        store.close()
    blocks = [b for b in body.split("\n\n") if b.strip()]
    assert blocks[-1].startswith("event: fsm-error\ndata: ") and "malformed" in blocks[-1]
    assert sum("fsm-error" in b for b in blocks) == 1


def test_a_stream_offset_past_the_end_of_the_log_is_refused_in_one_line(db_path, capsys) -> None:
    """``--from N`` past the log's end was accepted silently (and a live subscription there
    would miss the rows written next); a position inside the log still resumes."""
    from starlette.testclient import TestClient

    from fsm_engine.store import open_store
    from fsm_engine.ui import create_app
    engine = Engine(db_path, llm=Scripted.from_replies(SLOW), seed=1)
    iid, _ = run(engine, machine())
    end = len(engine.store.stream_read(iid))
    engine.close()
    for start in (str(end + 1), f"{end + 5}:1"):
        code, out, err = run_main(["stream", iid, "--db", db_path, "--from", start], capsys)
        lines = err.strip().splitlines()
        assert (code, out, len(lines)) == (2, "", 1), err
        assert lines[0].startswith("fsm: error: ") and "past the end" in lines[0]
    code, out, _ = run_main(["stream", iid, "--db", db_path, "--from", str(end)], capsys)
    assert code == 0 and out.rstrip().endswith("[completed]")
    store = open_store(db_path, readonly=True)
    try:
        with TestClient(create_app(store)) as client:
            got = client.get(f"/instances/{iid}/stream", headers={"Last-Event-ID": str(end + 1)})
            assert got.status_code == 400 and "past the end" in got.json()["error"]
    finally:
        store.close()
