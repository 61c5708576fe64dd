"""One model call per instance, with a short prompt: the shared rate-limit test's machine
(``tests/runtime/fleet/test_scale_limits.py``); its estimate (prompt + ``max_tokens``) is 61 tokens."""

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    n: int = 0
    answer: str = ""


async def ask(ctx: Ctx, step) -> dict:
    out = await step.llm.complete([{"role": "user", "content": "hi"}], max_tokens=50)
    return {"answer": out.text}


MACHINE = Machine(
    name="rated", context=Ctx, initial="ask",
    states=[State("ask", action=ask, queue="llm"), State("done", final=True)],
    transitions=[Transition("answered", "ask", "done")])
