"""Replay against a changed machine: identical when unchanged; a changed guard, a renamed
state and an inserted state each reported at the right seq; nothing written."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Transition
from fsm_engine.runtime.compiled import compile_machine
from fsm_engine.runtime.kinds.replay import replay


class Ctx(BaseModel):
    n: int = 0
    ok: bool = False


def grow(ctx: Ctx) -> dict:
    return {"n": 5}


def confirm(ctx: Ctx) -> dict:
    return {"ok": True}


def big(ctx: Ctx) -> bool:
    return ctx.n > 3


def huge(ctx: Ctx) -> bool:
    return ctx.n > 10


def make(guard=big, check: str = "check", insert: bool = False) -> Machine:
    first = "prep" if insert else check
    states = [State("init"), State("start", action=grow), State(check, action=confirm),
              State("done", final=True)]
    transitions = [Transition("begin", "init", "start"),
                   Transition("go", "start", first, conditions=guard),
                   Transition("small", "start", "done"),
                   Transition("ok", check, "done")]
    if insert:
        states.insert(2, State("prep"))
        transitions.append(Transition("prepared", "prep", check))
    return Machine(name="replayed", context=Ctx, initial="init", states=states,
                   transitions=transitions)


def _recorded(tmp_path):
    engine = Engine(str(tmp_path / "fsm.db"))
    iid = engine.start(make(), {})
    rec = asyncio.run(engine.run(iid))
    return engine, rec, engine.store.history(iid)


def test_unchanged_machine_replays_identically(tmp_path) -> None:
    engine, rec, history = _recorded(tmp_path)
    report = replay(compile_machine(make()), rec, history)
    assert report.identical and report.steps == 3
    engine.close()


def test_a_takeover_row_is_skipped_by_replay_and_fork(tmp_path) -> None:
    """An instance adopted by a second engine (its first went away holding it, its lease
    expired) replays as identical, and a fork copies the takeover row without counting it
    as a transition."""
    db = str(tmp_path / "fsm.db")
    first = Engine(db, clock=lambda: time.time() - 60)  # its lease ran out 50 s ago
    iid = first.start(make(), {})
    first.store.close()  # gone without Engine.close: it never gave the instance back
    engine = Engine(db)
    engine.register(make())
    rec = asyncio.run(engine.run(iid))
    history = engine.store.history(iid)
    assert [h.kind for h in history] == ["recovery", "transition", "transition", "transition"]
    report = replay(compile_machine(make()), rec, history)
    assert report.identical and report.steps == 4 and report.divergence is None
    fork = engine.store.get(engine.fork(iid, from_state="start"))  # entered by row 2
    assert (fork.state, fork.forked_at_seq, fork.loop_count, fork.seq) == ("start", 2, 1, 2)
    assert engine.store.check() == []
    engine.close()


def test_changed_guard_renamed_and_inserted_states_are_reported_at_their_seq(tmp_path) -> None:
    engine, rec, history = _recorded(tmp_path)
    guard = replay(compile_machine(make(guard=huge)), rec, history)
    assert guard.divergence == {"seq": 2, "source": "start", "recorded": ["go", "check"],
                                "now": ["small", "done"], "why": "another transition"}
    assert guard.guards == [{"seq": 2, "recorded": [["big", True]], "now": [["huge", False]]}]
    renamed = replay(compile_machine(make(check="validate")), rec, history)
    assert renamed.missing_states == [{"seq": 2, "state": "check"}]
    assert renamed.divergence["seq"] == 2 and renamed.divergence["now"] == ["go", "validate"]
    inserted = replay(compile_machine(make(insert=True)), rec, history)
    assert inserted.divergence["seq"] == 2 and inserted.divergence["now"] == ["go", "prep"]
    assert inserted.missing_states == []
    engine.close()


def test_cli_replay_writes_nothing(tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "helpers"))
    module = str(Path(__file__).resolve().parents[2] / "helpers" / "review_machine.py")
    db = str(tmp_path / "fsm.db")
    import review_machine
    engine = Engine(db)
    iid = engine.start(review_machine.machine, {"text": "x"})
    asyncio.run(engine.run(iid))
    engine.close()
    before = Path(db).read_bytes()
    same = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "replay", iid, module, "--db",
                           db, "--json"], capture_output=True, text=True, timeout=60)
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["identical"] is True
    other = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "replay", iid,
                            module + ":spinner", "--db", db], capture_output=True, text=True,
                           timeout=60)
    assert other.returncode == 1 and "no longer exists" in other.stdout
    assert Path(db).read_bytes() == before
