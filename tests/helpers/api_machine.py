"""Machines of ``fsm serve``'s tests (issue 38 item 7).

``door`` (``machine``): waits in ``hold`` for ``release`` (its payload may set ``note``),
then ``ship`` appends ``shipped`` to the note and ends in ``done``; an ``order`` (text) is
required, ``qty`` a positive integer.  ``other``: a machine the tests do not serve.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from fsm_engine import Machine, State, Transition


class Line(BaseModel):
    sku: str
    count: int = 1


class Order(BaseModel):
    order: str
    qty: int = Field(default=1, gt=0)
    note: str = ""
    lines: list[Line] = Field(default_factory=list)


async def ship(ctx: Order) -> dict[str, Any]:
    return {"note": (ctx.note + " shipped").strip()}


machine = Machine(
    name="door", initial="hold", context=Order,
    states=[State("hold", wait=True), State("ship", action=ship), State("done", final=True)],
    transitions=[Transition("release", "hold", "ship"), Transition("next", "ship", "done")])

other = Machine(
    name="other", initial="hold", context=Order,
    states=[State("hold", wait=True), State("done", final=True)],
    transitions=[Transition("release", "hold", "done")])
