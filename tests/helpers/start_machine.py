"""The machine of the start-option tests (issue 38): ``work`` adds ``n`` to ``total``, then
``done``; no model."""

from __future__ import annotations

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    n: int = 0
    total: int = 0


def work(ctx: Ctx) -> dict:
    return {"total": ctx.total + ctx.n}


def machine(name: str = "starts") -> Machine:
    """The start machine under ``name``."""
    return Machine(name=name, context=Ctx, initial="work",
                   states=[State("work", action=work), State("done", final=True)],
                   transitions=[Transition("next", "work", "done")])


MACHINE = machine()
