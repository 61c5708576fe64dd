"""A reminder loop that uses time: wait for a reply, remind after a delay, escalate after
``max_reminders`` reminders (issue 38).

``ask`` sends the question; ``await_reply`` waits, holding no worker, for ``fsm send ID
reply --set answer=...``.  Its timer edge ``nudge`` fires when no reply came within
``REMIND_AFTER`` (24 h): to ``remind`` (one more reminder, then back to waiting, the
timer armed again) or, once ``max_reminders`` were sent, to ``escalate``.  A reply and
the timer race: whichever commits first wins, the other is refused.

Run it on the virtual clock with ``fsm test machines/reminder.py``: a day passes in
milliseconds (its last case asks every morning at 9, Paris time, through a schedule:
``fsm schedule add``'s cron, two ticks, one instance each).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition

#: How long ``await_reply`` waits before the next reminder.
REMIND_AFTER = timedelta(hours=24)


class Reminder(BaseModel):
    """Instance context."""

    to: str = "someone@example.com"
    question: str = "Can you confirm the order?"
    answer: str | None = None
    reminders: int = 0
    max_reminders: int = 3
    log: list[str] = []


def ask(ctx: Reminder) -> dict[str, Any]:
    """Send the question (here: noted in ``log``)."""
    return {"log": [*ctx.log, f"asked {ctx.to}: {ctx.question}"]}


def remind(ctx: Reminder) -> dict[str, Any]:
    """Send one more reminder."""
    n = ctx.reminders + 1
    return {"reminders": n, "log": [*ctx.log, f"reminder {n} to {ctx.to}"]}


def escalate(ctx: Reminder) -> dict[str, Any]:
    """Hand the question to a person (here: noted in ``log``)."""
    return {"log": [*ctx.log, f"escalated after {ctx.reminders} reminders"]}


def out_of_reminders(ctx: Reminder) -> bool:
    """True once ``max_reminders`` reminders were sent."""
    return ctx.reminders >= ctx.max_reminders


machine = Machine(
    name="reminder",
    context=Reminder,
    initial="ask",
    max_transitions=50,
    description="Wait for a reply, remind after a delay, escalate after N reminders.",
    states=[
        State("ask", action=ask),
        State("await_reply", wait=True),
        State("remind", action=remind),
        State("escalate", action=escalate),
        State("answered", final=True),
        State("escalated", final=True),
        State("failed", final=True, failure=True),
    ],
    transitions=[
        Transition("asked", "ask", "await_reply"),
        Transition("reply", "await_reply", "answered"),
        Transition("nudge", "await_reply", "escalate", after=REMIND_AFTER,
                   conditions=out_of_reminders),
        Transition("nudge", "await_reply", "remind", after=REMIND_AFTER),
        Transition("reminded", "remind", "await_reply"),
        Transition("handed_over", "escalate", "escalated"),
    ],
)

_DAY = 24 * 3600

#: Example cases (``fsm test machines/reminder.py``): every edge, on the virtual clock.
CASES = [
    {"name": "replied before any reminder", "input": {},
     "decisions": [{"send": "reply", "update": {"answer": "yes"}, "by": "customer"}],
     "path": ["ask", "await_reply", "answered"], "output": {"answer": "yes", "reminders": 0}},
    {"name": "replied after one reminder", "input": {},
     "decisions": [{"advance": _DAY + 60}, {"send": "reply", "update": {"answer": "ok"}}],
     "path": ["ask", "await_reply", "remind", "await_reply", "answered"],
     "output": {"reminders": 1}},
    {"name": "no reply: escalated after three reminders", "input": {},
     "path": ["ask", "await_reply", "remind", "await_reply", "remind", "await_reply",
              "remind", "await_reply", "escalate", "escalated"],
     "status": "completed", "output": {"reminders": 3, "answer": None}},
    {"name": "no reminders allowed: escalated at the first timer", "input": {"max_reminders": 0},
     "moves": [["ask", "asked", "await_reply"], ["await_reply", "nudge", "escalate"],
               ["escalate", "handed_over", "escalated"]]},
    {"name": "asked every morning by a schedule, answered each time",
     "input": {"question": "Anything blocking you today?"},
     "schedule": {"cron": "0 9 * * *", "tz": "Europe/Paris", "ticks": 2},
     "decisions": [{"send": "reply", "update": {"answer": "no"}, "by": "team"}],
     "instances": 2, "path": ["ask", "await_reply", "answered"], "output": {"answer": "no"}},
]
