"""Source of a machine module (written to a file by the tests): ``plain``, one state
firing ``next`` to ``done``; its context a single ``note: str``."""

from __future__ import annotations

PLAIN = """
from pydantic import BaseModel

from fsm_engine import Machine, State, Transition, fire


class C(BaseModel):
    note: str = ""


def go(ctx, step):
    return fire("next")

machine = Machine(name="plain", initial="go", context=C, states=[State("go", action=go),
                  State("done", final=True)], transitions=[Transition("next", "go", "done")])
"""
