"""Kinds of step as plug-ins (issue 37): a throwaway kind, one module
(``tests/helpers/cooldown_kind.py``) and one registration, runs end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from cooldown_kind import KIND, cooling, registered

from fsm_engine.definition.export import export_machine, fingerprint
from fsm_engine.diagram.model import state_notes
from fsm_engine.errors import DefinitionError, FsmError
from fsm_engine.runtime.kinds import base


@pytest.fixture
def cooldown() -> Iterator[base.StepKind]:
    with registered() as kind:  # the one registration
        yield kind


def test_a_registered_kind_runs_end_to_end(cooldown: base.StepKind,
                                            engine_factory: Any) -> None:
    now = [1000.0]
    engine = engine_factory(clock=lambda: now[0])
    iid = engine.start(cooling(), {})
    rec = asyncio.run(engine.run(iid))
    assert (rec.state, rec.status, rec.owner) == ("rest", "waiting", None)
    assert rec.next_attempt_at == pytest.approx(1030.0)
    now[0] = 1010.0  # not due yet: a run leaves it waiting, its timer kept
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.next_attempt_at) == ("waiting", pytest.approx(1030.0))
    now[0] = 1031.0
    [done] = asyncio.run(engine.resume())  # any worker or ``fsm resume`` fires it once due
    assert (done.state, done.status, done.context["n"]) == ("done", "completed", 2)
    rows = [h for h in engine.store.history(iid) if h.kind != "recovery"]  # (the jump
    # of the clock outran the lease: the claim records a takeover)
    assert [(h.source, h.dest, h.trigger) for h in rows] == [
        ("work", "rest", "next"), ("rest", "again", "go"), ("again", "done", "next")]
    assert rows[1].reason == "cooled"


def test_the_kind_is_resolved_once_per_compiled_machine(cooldown: base.StepKind) -> None:
    from fsm_engine.runtime.compiled import compile_machine
    cm = compile_machine(cooling(name="cooldown-table"))
    kinds = base.table(cm)
    assert kinds is base.table(cm) is cm.kinds
    assert (kinds["rest"], kinds["work"]) == (KIND, base.PLAIN)
    assert base.registered()[-2:] == ("cooldown", "action")


def test_its_definition_is_checked_exported_and_drawn(cooldown: base.StepKind) -> None:
    with pytest.raises(DefinitionError) as err:
        from fsm_engine.runtime.compiled import compile_machine
        compile_machine(cooling(seconds=0, then="nope", name="cooldown-bad"))
    assert err.value.problems == [
        "state 'rest': kind 'cooldown': seconds must be > 0, not 0",
        "state 'rest': kind 'cooldown': trigger 'nope' is not declared from 'rest'"]
    [rest] = [s for s in export_machine(cooling())["states"] if s["name"] == "rest"]
    assert rest["kind"] == {"name": "cooldown", "note": "cooldown 30s", "seconds": 30.0,
                            "then": "go"}
    assert "cooldown 30s" in state_notes(rest)
    assert fingerprint(cooling(seconds=5)) != fingerprint(cooling())


def test_a_kind_name_is_registered_once(cooldown: base.StepKind) -> None:
    with pytest.raises(FsmError, match="registered already"):
        base.register(type(KIND)())
    with pytest.raises(FsmError, match="registered already"):
        base.register(base.PlainAction())
