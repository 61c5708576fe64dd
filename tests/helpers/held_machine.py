"""A machine whose instances wait in ``hold`` until sent ``release``: a schedule's instance
that goes on running (the overlap tests)."""

from __future__ import annotations

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    label: str = ""


machine = Machine(
    name="held", context=Ctx, initial="hold",
    states=[State("hold", wait=True), State("done", final=True)],
    transitions=[Transition("release", "hold", "done")])
