"""The definition's one protocol for kinds of step (``definition.kind``, issue 37): every
built-in field and a plug-in's spec are seen through a ``StateKind``, which check,
export, diagrams, timers and the compiled machine ask instead of the fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fsm_engine import Machine, State, Transition
from fsm_engine.definition import kind
from fsm_engine.definition.agent import AGENT, Agent
from fsm_engine.definition.check_fanout import FAN_OUT
from fsm_engine.definition.fanout import Map
from fsm_engine.definition.review import REVIEW, Review
from fsm_engine.definition.timers import waits
from fsm_engine.diagram.model import state_notes
from fsm_engine.runtime.compiled import compile_machine
from tests.helpers.broken_kinds import Ctx, Out, act, look
from tests.helpers.cooldown_kind import Cooldown, cooling


@dataclass(frozen=True)
class Ask:
    """A plug-in spec declaring the optional members: it parks and calls a model."""

    name: ClassVar[str] = "ask"
    parks: ClassVar[bool] = True
    calls_model: ClassVar[bool] = True

    def problems(self, state: str, fields: Any, triggers: Any) -> list[str]:
        return []

    def export(self) -> dict[str, Any]:
        return {}

    def note(self) -> str:
        return "asks"


def test_each_field_and_a_plug_in_resolve_to_one_kind() -> None:
    states = {
        "plain": State("plain", action=act),
        "wait": State("wait", wait=True),
        "review": State("review", review=Review("?")),
        "fan": State("fan", fan_out=Map(items="items", machine=act, into="items")),
        "agent": State("agent", agent=Agent(tools=[look], output=Out)),
        "plug": State("plug", kind=Cooldown(1.0)),
    }
    got = {name: kind.spec_of(s) for name, s in states.items()}
    assert got == {"plain": None, "wait": kind.WAIT, "review": REVIEW, "fan": FAN_OUT,
                   "agent": AGENT, "plug": kind.PLUGIN}
    assert [k.name for k in kind.KINDS] == ["wait", "review", "fan_out", "agent", "kind"]
    both = State("both", wait=True, kind=Cooldown(1.0))  # refused by check: both report
    assert kind.kinds_of(both) == (kind.WAIT, kind.PLUGIN)
    assert [n for n, s in states.items() if waits(s)] == ["wait", "review", "fan"]


def test_a_plug_in_may_park_on_entry_and_call_a_model() -> None:
    m = Machine(name="asking", context=Ctx, initial="go", namespace=globals(), states=[
        State("go", action=act), State("ask", kind=Ask()),
        State("hold", wait=True), State("done", final=True)],
        transitions=[Transition("next", "go", "ask"), Transition("next", "ask", "hold"),
                     Transition("next", "hold", "done")])
    cm = compile_machine(m)
    assert cm.parks == {"ask", "hold"} and cm.model_use() == "declared"
    assert compile_machine(cooling(name="cooling-parks")).parks == frozenset()
    [ask] = [s for s in m.export()["states"] if s["name"] == "ask"]
    assert ask["kind"] == {"name": "ask", "note": "asks"} and "asks" in state_notes(ask)
