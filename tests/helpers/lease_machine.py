"""A machine whose one working state waits at a gate the test opens (the lease-loss
tests: instances held mid-step while their worker loses its lease)."""

from __future__ import annotations

import asyncio
import sys
import threading
import types

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition

# One list and one event however often this file is loaded (the test imports it by name,
# a worker's engine by its path, as another module): both live in a module of their own.
_SHARED = sys.modules.setdefault("lease_machine_shared", types.ModuleType("lease_machine_shared"))
if not hasattr(_SHARED, "ENTERED"):
    _SHARED.ENTERED, _SHARED.OPEN = [], threading.Event()
#: Instance ids in the order their ``hold`` action started (every attempt, every worker).
ENTERED: list[str] = _SHARED.ENTERED
#: Set by the test to let every ``hold`` action finish (read from any event loop).
OPEN: threading.Event = _SHARED.OPEN


class Ctx(BaseModel):
    n: int = 0


async def hold(ctx: Ctx, step) -> dict:  # noqa: ANN001 - the runtime's Step
    ENTERED.append(step.instance_id)
    while not OPEN.is_set():  # a poll, so the action stays cancellable on any loop
        await asyncio.sleep(0.01)
    return {"n": ctx.n + 1}


gated = Machine(name="gated", context=Ctx, initial="hold", max_transitions=5,
                states=[State("hold", action=hold), State("done", final=True)],
                transitions=[Transition("ok", "hold", "done")])
