"""A model-driven router whose two nodes can bounce between each other forever.

``draft`` asks the model whether the draft is ready (``to_review``) or
done (``finish``); ``review`` asks whether to send it back (``revise``) or
accept it (``accept``).  A model that keeps saying "revise" would loop
forever; ``max_transitions`` stops the instance in ``failed`` with reason
``loop_limit`` exactly at the cap, also across crashes and resumes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, State, Step, Transition, fire
from fsm_engine.routing import choose_trigger


class Routing(BaseModel):
    """Instance context."""

    topic: str = "a haiku about state machines"
    draft: str = ""
    rounds: int = 0
    route: list[str] = []


async def draft(ctx: Routing, step: Step) -> Any:
    """Write or revise the draft, then let the model route: to_review or finish."""
    out = await step.llm.complete([
        {"role": "user", "content": f"Write {ctx.topic}. Previous draft: {ctx.draft or '(none)'}. "
         "End with one word on its own line: to_review or finish."}], max_tokens=60)
    trigger = choose_trigger(out.text, step.triggers, default="to_review")
    return fire(trigger, draft=out.text[:500], rounds=ctx.rounds + 1, route=ctx.route + [trigger])


async def review(ctx: Routing, step: Step) -> Any:
    """Review the draft; the model routes: revise or accept."""
    out = await step.llm.complete([
        {"role": "user", "content": f"Review this draft:\n{ctx.draft}\n"
         "Answer with one word: revise or accept."}], max_tokens=20)
    trigger = choose_trigger(out.text, step.triggers, default="revise")
    return fire(trigger, route=ctx.route + [trigger])


RETRY = RetryPolicy(max_attempts=3, initial_interval=0.5, max_interval=5.0)

machine = Machine(
    name="router",
    context=Routing,
    initial="draft",
    max_transitions=12,
    token_budget=20000,
    states=[
        State("draft", action=draft, retry=RETRY, timeout=60.0),
        State("review", action=review, retry=RETRY, timeout=60.0),
        State("done", final=True),
        State("failed", final=True, failure=True),
    ],
    transitions=[
        Transition("to_review", "draft", "review"),
        Transition("finish", "draft", "done"),
        Transition("revise", "review", "draft"),
        Transition("accept", "review", "done"),
    ],
)

_DRAFT, _REVIEW = "Write ", "Review this draft"

#: Example cases (``fsm test machines/router.py``): every edge, the loop cap, and each
#: state's retries and timeout exhausted; ``delay_s`` and the backoffs are virtual time.
CASES = [
    {"name": "finished at once", "input": {},
     "replies": [{"match": _DRAFT, "text": "Haiku.\nfinish"}],
     "path": ["draft", "done"], "status": "completed"},
    {"name": "reviewed and accepted", "input": {},
     "replies": [{"match": _DRAFT, "text": "Haiku.\nto_review"},
                 {"match": _REVIEW, "text": "accept"}],
     "path": ["draft", "review", "done"], "output": {"route": ["to_review", "accept"]}},
    {"name": "revised forever: the loop cap", "input": {},
     "replies": [{"match": _DRAFT, "text": "Haiku.\nto_review"},
                 {"match": _REVIEW, "text": "revise"}],
     "final": "failed", "status": "failed", "output": {"rounds": 6}},
    {"name": "draft model down: retries exhausted", "input": {},
     "replies": [{"match": _DRAFT, "error": "unavailable"}],
     "path": ["draft", "failed"], "status": "failed"},
    {"name": "draft model too slow: timeouts", "input": {},
     "replies": [{"match": _DRAFT, "text": "finish", "delay_s": 61}],
     "path": ["draft", "failed"], "status": "failed"},
    {"name": "review model down", "input": {},
     "replies": [{"match": _DRAFT, "text": "Haiku.\nto_review"},
                 {"match": _REVIEW, "error": "http500"}],
     "path": ["draft", "review", "failed"], "status": "failed"},
    {"name": "review model too slow", "input": {},
     "replies": [{"match": _DRAFT, "text": "Haiku.\nto_review"},
                 {"match": _REVIEW, "text": "accept", "delay_s": 61}],
     "path": ["draft", "review", "failed"], "status": "failed"},
]
