"""A machine whose guard reads the token budgets (``RunInfo``): the instance's and the
state's per-visit one, as spent by the state's model call (tests/runtime/kinds/test_replay_budget.py)."""

from __future__ import annotations

from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, RunInfo, State, Transition
from fsm_engine.runtime.step import Step


class Ctx(BaseModel):
    answer: str = ""


async def ask(ctx: Ctx, step: Step) -> dict[str, str]:
    reply = await step.llm.complete([{"role": "user", "content": "answer briefly"}])
    return {"answer": reply.text}


def within_budget(ctx: Ctx, run: RunInfo) -> bool:
    """True when the state's budget is known and its visit spent 70 of its 500 tokens."""
    return (run.state_token_budget, run.state_tokens_remaining, run.tokens_remaining) \
        == (500, 430, 930)


machine = Machine(
    name="budget_guard", context=Ctx, initial="ask", token_budget=1000,
    states=[State("ask", action=ask, token_budget=500), State("rich", final=True),
            State("poor", final=True)],
    transitions=[Transition("afford", "ask", "rich", conditions=within_budget),
                 Transition("short", "ask", "poor")])


def after_retry(ctx: Ctx, run: RunInfo) -> bool:
    """True when the visit's budget counts the failed attempt's 30 tokens and the reply's 70,
    and the instance's count does too."""
    return (run.state_tokens_used, run.tokens_used, run.loop_count) == (100, 100, 0)


retried = Machine(
    name="budget_guard_retry", context=Ctx, initial="ask", token_budget=1000,
    states=[State("ask", action=ask, retry=RetryPolicy(max_attempts=2, initial_interval=0.01,
                                                        jitter=0.0)),
            State("rich", final=True), State("poor", final=True)],
    transitions=[Transition("afford", "ask", "rich", conditions=after_retry),
                 Transition("short", "ask", "poor")])
