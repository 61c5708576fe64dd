"""A throwaway kind of step, the way a plug-in adds one (issue 37): this one module, and
one registration (``register(KIND)``, done by the test that uses it).

``State("rest", kind=Cooldown(30, then="go"))``: entering the state, the instance waits
``seconds`` (holding no worker; any run, worker or ``fsm resume`` steps it once due),
then fires ``then``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.runtime.kinds.base import (
    DriverAPI,
    StepKind,
    register,
    timer_due,
    unregister,
    waiting,
)


@dataclass(frozen=True)
class Cooldown:
    """The definition half (``fsm_engine.definition.kind.KindSpec``)."""

    seconds: float
    then: str = "done"
    name: ClassVar[str] = "cooldown"

    def problems(self, state: str, fields: Sequence[str], triggers: Sequence[str]) -> list[str]:
        out = [] if self.seconds > 0 else [f"seconds must be > 0, not {self.seconds!r}"]
        if self.then not in triggers:
            out.append(f"trigger {self.then!r} is not declared from {state!r}")
        return out

    def export(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "then": self.then}

    def note(self) -> str:
        return f"cooldown {self.seconds:g}s"


class CooldownKind(StepKind):
    """The step half: wait, then fire ``then``."""

    name = "cooldown"  # matches the states whose ``kind`` is named so (``StepKind.matches``)

    def plan(self, api: DriverAPI, cm: Any, rec: Any, state: Any, now: float) -> Any:
        spec = state.kind
        if timer_due(rec, now):
            return api.advance(cm, rec, state, None, spec.then, {}, 0.0, reason="cooled")
        due = rec.next_attempt_at if rec.status == "waiting" and rec.next_attempt_at \
            else now + spec.seconds
        return waiting(rec, now, until=due)


KIND = CooldownKind()


@contextmanager
def registered() -> Iterator[StepKind]:
    """``KIND`` registered (the one registration) while the block runs."""
    register(KIND)
    try:
        yield KIND
    finally:
        unregister(KIND.name)


class Ctx(BaseModel):
    n: int = 0


def bump(ctx: Ctx) -> dict[str, int]:
    return {"n": ctx.n + 1}


def cooling(seconds: float = 30.0, then: str = "go", name: str = "cooldown-demo") -> Machine:
    """work -> rest (cool down ``seconds``, then ``then``) -> again -> done."""
    return Machine(name=name, context=Ctx, initial="work", states=[
        State("work", action=bump), State("rest", kind=Cooldown(seconds, then=then)),
        State("again", action=bump), State("done", final=True)],
        transitions=[Transition("next", "work", "rest"), Transition("go", "rest", "again"),
                     Transition("next", "again", "done")])


machine = cooling()
