"""A one-step machine whose step holds its lease ~20 ms: the partition-limit test's
(``tests/runtime/fleet/test_scale_limits.py``), so 500 instances run in seconds."""

import asyncio

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    path: str = ""


async def work(ctx: Ctx) -> None:
    await asyncio.sleep(0.02)


MACHINE = Machine(
    name="tenant-work", context=Ctx, initial="work",
    states=[State("work", action=work), State("done", final=True)],
    transitions=[Transition("worked", "work", "done")])
