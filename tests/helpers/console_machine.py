"""Machines of the operator console's tests (issue 25).

``console``: ``slow`` (polls for the file ``$CONSOLE_GATE`` to exist) → ``quick`` →
``done``; each action appends its state and the instance's ``n`` to ``$CONSOLE_LOG``.
``inbox``: waits in ``hold`` for ``release`` (``fsm send``), with a ``note`` field.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    n: int = 0


def _log(what: str) -> None:
    path = os.environ.get("CONSOLE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(what + "\n")


async def slow(ctx: Ctx) -> dict[str, Any]:
    _log(f"slow {ctx.n}")
    gate = os.environ.get("CONSOLE_GATE")
    while gate and not os.path.exists(gate):
        await asyncio.sleep(0.02)
    return {"n": ctx.n + 1}


async def quick(ctx: Ctx) -> dict[str, Any]:
    _log(f"quick {ctx.n}")
    return {"n": ctx.n + 10}


machine = Machine(
    name="console", initial="slow", context=Ctx,
    states=[State("slow", action=slow), State("quick", action=quick), State("done", final=True)],
    transitions=[Transition("next", "slow", "quick"), Transition("next", "quick", "done")])


class Note(BaseModel):
    note: str = ""
    count: int = 0


inbox = Machine(
    name="inbox", initial="hold", context=Note,
    states=[State("hold", wait=True), State("done", final=True)],
    transitions=[Transition("release", "hold", "done")])
