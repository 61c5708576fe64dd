"""Pins what the definition layer says about every kind of step (issue 37): the export
and fingerprint of the repository's machines and of the test machines with review,
fan-out, agent, wait, timer and plug-in states, their diagram notes, and the problem
lists ``check`` gives for machines whose kinds are wrong (``tests/helpers/broken_kinds``).

The export feeds each machine's fingerprint, stored with every instance: a change here
makes stored instances need a migration, so it must be deliberate.  Regenerate the pins
(``tests/definition/kind_pins.json``) only for such a change:
``python -c "from tests.definition.test_kind_pins import write; write()"``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from fsm_engine.definition.check import check
from fsm_engine.definition.export import export_machine, fingerprint
from fsm_engine.definition.spec import Machine
from fsm_engine.diagram.model import state_notes
from fsm_engine.errors import DefinitionError
from tests.helpers.broken_kinds import BROKEN

PINS = Path(__file__).with_name("kind_pins.json")
MODULES = (
    "machines.agent", "machines.digest", "machines.moderation", "machines.reminder",
    "machines.report", "machines.router", "machines.screenshot",
    "tests.helpers.agent_machine", "tests.helpers.api_machine",
    "tests.helpers.console_machine", "tests.helpers.cooldown_kind",
    "tests.helpers.export_machine", "tests.helpers.held_machine",
    "tests.helpers.parallel_machines", "tests.helpers.review_machine",
    "tests.helpers.timer_machine", "tests.helpers.review_family_source",
    "tests.integration.matrix_machines",
)


def machines() -> dict[str, Machine]:
    """Every module-level machine of ``MODULES``, by ``module:name``."""
    found: dict[str, Machine] = {}
    for name in MODULES:
        for attr, value in vars(importlib.import_module(name)).items():
            if isinstance(value, Machine):
                found[f"{name}:{attr}"] = value
    return found


def _pin(machine: Machine) -> dict[str, Any]:
    exported = export_machine(machine)
    blob = json.dumps(exported, default=str)  # key order too: byte for byte
    return {"export": hashlib.sha256(blob.encode()).hexdigest(),
            "fingerprint": fingerprint(machine),
            "notes": [list(state_notes(s)) for s in exported["states"]]}


def _problems(machine: Machine) -> list[str]:
    with pytest.raises(DefinitionError) as err:
        check(machine)
    return list(err.value.problems)


def current() -> dict[str, Any]:
    """What the pins would be now."""
    return {"machines": {k: _pin(m) for k, m in machines().items()},
            "problems": {k: _problems(build()) for k, build in BROKEN.items()}}


def write() -> None:
    """Rewrite the pins from the code as it is (a deliberate change of the export)."""
    PINS.write_text(json.dumps(current(), indent=1, ensure_ascii=False, sort_keys=True) + "\n")


PINNED = json.loads(PINS.read_text())


@pytest.mark.parametrize("key", sorted(PINNED["machines"]))
def test_the_export_and_fingerprint_stay(key: str) -> None:
    assert _pin(machines()[key]) == PINNED["machines"][key]


def test_every_pinned_machine_is_still_found() -> None:
    assert sorted(machines()) == sorted(PINNED["machines"])


def test_the_pins_cover_every_kind() -> None:
    kinds = {f for m in machines().values() for s in m.states
             for f in ("review", "fan_out", "agent", "kind", "wait") if getattr(s, f)}
    timed = any(t.after is not None for m in machines().values() for t in m.transitions)
    assert kinds == {"review", "fan_out", "agent", "kind", "wait"} and timed


@pytest.mark.parametrize("key", sorted(BROKEN))
def test_the_problems_stay(key: str) -> None:
    assert _problems(BROKEN[key]()) == PINNED["problems"][key]
