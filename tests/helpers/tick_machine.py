"""The machine the schedule tests start on every tick: it completes in one step (its
context keeps the label the schedule gave it)."""

from __future__ import annotations

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    label: str = ""
    runs: int = 0


def work(ctx: Ctx) -> dict:
    return {"runs": ctx.runs + 1}


machine = Machine(
    name="ticked", context=Ctx, initial="work",
    states=[State("work", action=work), State("done", final=True)],
    transitions=[Transition("next", "work", "done")])
