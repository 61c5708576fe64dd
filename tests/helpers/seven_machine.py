"""A seven-step machine for the tracing tests (imports nothing from OpenTelemetry)."""

from __future__ import annotations

from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, State, Step, Transition

SECRET = "PROMPT-TEXT-NEVER-IN-SPANS"


class C(BaseModel):
    n: int = 0
    answer: str = ""


def bump(ctx: C) -> dict:
    return {"n": ctx.n + 1}


async def ask(ctx: C, step: Step) -> dict:
    out = await step.llm.complete([{"role": "user", "content": SECRET}], max_tokens=32)
    return {"answer": out.text, "n": ctx.n + 1}


def seven_steps() -> Machine:
    """s0 → s1 → … → s6 → done: seven steps; s3 asks the model (retried once)."""
    names = [f"s{i}" for i in range(7)]
    states = [State(n, action=ask if n == "s3" else bump,
                    retry=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=0.0)
                    if n == "s3" else None) for n in names]
    return Machine(name="seven", context=C, initial="s0", max_transitions=20,
                   states=[*states, State("done", final=True)],
                   transitions=[Transition("next", a, b)
                                for a, b in zip(names, [*names[1:], "done"], strict=False)])
