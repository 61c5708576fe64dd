"""The ``final`` event's own cursor (issue 36, from the last note): a resume from it gives
nothing more — ``engine.stream`` ends at once, the viewer answers 204 (which stops an
``EventSource`` reconnecting; it got ``final`` again every second) — while a resume from
the last step's cursor still gives ``final``."""

from __future__ import annotations

import asyncio
from typing import Any

from streamed_machine import CHUNKS, machine, run

from fsm_engine import Engine
from fsm_engine.llm.scripted import Scripted


def collect(engine: Engine, iid: str, cursor: str = "0") -> list[Any]:
    async def go() -> list[Any]:
        return [ev async for ev in engine.stream(iid, cursor)]
    return asyncio.run(go())


def test_a_resume_from_the_final_events_cursor_gives_nothing_more(db_path) -> None:
    from starlette.testclient import TestClient

    from fsm_engine.store import open_store
    from fsm_engine.ui import create_app
    engine = Engine(db_path, llm=Scripted.from_replies([{"chunks": CHUNKS,
                                                         "chunk_delay_s": 0.03}]), seed=1)
    iid, _ = run(engine, machine())
    evs = collect(engine, iid)
    step, final = evs[-2:]
    assert (step.kind, final.kind) == ("step", "final") and final.cursor != step.cursor
    assert collect(engine, iid, final.cursor) == []
    assert collect(engine, iid, step.cursor) == [final]
    engine.close()
    store = open_store(db_path, readonly=True)
    try:
        with TestClient(create_app(store)) as client:
            url = f"/instances/{iid}/stream"
            done = client.get(url, headers={"Last-Event-ID": final.cursor})
            assert (done.status_code, done.text) == (204, "")
            again = client.get(url, headers={"Last-Event-ID": step.cursor})
            assert again.status_code == 200 and '"kind": "final"' in again.text
    finally:
        store.close()
