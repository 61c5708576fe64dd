"""What an agent turn stores (issue 36, item 15): a reply is kept whole once, in its
``llm_calls`` entry (under the size cap of one call); the turn's other fields are capped —
a turn whose calls' arguments run past ``agent_journal.MAX_CALLS_CHARS`` (64,000) is an error turn fed back to
the model, so neither the turn's ``calls`` nor a call row repeats the reply.  Scripted
model, a real SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import agent_machine

from fsm_engine import Engine
from fsm_engine.llm import Scripted
from fsm_engine.store.records import TOOL

BIG = "y" * 200_000


def test_a_huge_call_is_stored_once_and_refused_as_a_turn(tmp_path: Path) -> None:
    replies = [{"text": json.dumps({"tool": "echo", "arguments": {"text": BIG}})},
               {"text": json.dumps({"final": {"answer": "ok"}})}]
    model = Scripted.from_replies(replies)
    engine = Engine(str(tmp_path / "fsm.db"), llm=model)
    try:
        iid = engine.start(agent_machine.machine, {"question": "q"})
        rec = asyncio.run(engine.run(iid))
        assert (rec.status, rec.state) == ("completed", "answered")
        rows = engine.store.history(iid)
        stored = sum(len(json.dumps(r.detail)) for r in rows)
        assert len(BIG) < stored < len(BIG) + 20_000, stored  # one copy, not three
        [turn] = [r for r in rows if r.kind == TOOL]  # no call row: nothing ran
        assert turn.detail["calls"] == [] and "at most 64,000" in turn.detail["error"]
        assert "at most" in model.requests[1][-1]["content"]  # the model is told why
    finally:
        engine.close()
