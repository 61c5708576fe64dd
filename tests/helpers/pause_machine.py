"""The retrying machine of the pause tests (issue 25): its action ``flaky`` raises
``ServerError`` while ``FAULTY["on"]``, three attempts; each action run is appended
to ``CALLS`` (module globals: reset them in the test)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, ServerError, State, Transition

CALLS: list[str] = []


class Ctx(BaseModel):
    n: int = 0


FAULTY = {"on": True}


async def flaky(ctx: Ctx) -> dict[str, Any]:
    CALLS.append("flaky")
    if FAULTY["on"]:
        raise ServerError("upstream 503")
    return {"n": 1}


def retrying(state_policy: str | None = None, machine_policy: str | None = "pause",
             name: str = "retrying") -> Machine:
    return Machine(
        name=name, initial="a", context=Ctx, on_retries_exhausted=machine_policy,
        states=[State("a", action=flaky, on_exhausted=state_policy,
                      retry=RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=0.0)),
                State("done", final=True)],
        transitions=[Transition("next", "a", "done")])
