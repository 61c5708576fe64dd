"""Checks of a finished instance read back from its store (the real-model tests)."""

from __future__ import annotations

from fsm_engine import Engine
from fsm_engine.views import context_after


def check_instance(eng: Engine, rec) -> None:
    """Final, gap-free history that replays to the stored context, tokens that add up."""
    assert rec.final and (rec.status == "completed" or rec.reason), (rec.status, rec.reason)
    rows = eng.store.history(rec.id)
    assert [h.seq for h in rows] == list(range(1, rec.seq + 1))
    assert rows[-1].dest == rec.state
    assert context_after(rec, rows)[-1] == rec.context
    billed = sum(h.tokens for h in rows) + sum(a.tokens for a in eng.store.attempts(rec.id))
    assert billed == rec.tokens_used > 0
