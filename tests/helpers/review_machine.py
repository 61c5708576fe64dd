"""A machine with a review state (tests of the review queue, fork and the CLI).

classify → human-review → publish (a side effect) → done, or → rejected.
``REVIEW_SLA_S`` sets the review's SLA (seconds; on timeout: reject).
A second machine, ``spinner``, loops until its loop cap sends it to review.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel

from fsm_engine import Machine, State, Step, Transition
from fsm_engine.definition.review import Review

SLA = float(os.environ.get("REVIEW_SLA_S", "3600"))


class Ctx(BaseModel):
    text: str
    label: str = ""
    score: int = 0
    published: list[str] = []


class Edit(BaseModel):
    label: Literal["ok", "bad"]


def classify(ctx: Ctx) -> dict[str, Any]:
    return {"label": "unsure", "score": len(ctx.text)}


def publish(ctx: Ctx, step: Step) -> dict[str, Any]:
    path = os.environ.get("REVIEW_SINK")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(step.idempotency_key + "\n")
    return {"published": [*ctx.published, ctx.label]}


machine = Machine(
    name="reviewed", context=Ctx, initial="classify", max_transitions=20,
    states=[
        State("classify", action=classify),
        State("human-review", review=Review(
            prompt="Is this label right?", show=["text", "label", "score"], editable=Edit,
            choices=["approve", "reject"], sla_s=SLA, on_timeout="reject")),
        State("publish", action=publish, side_effect=True),
        State("done", final=True),
        State("rejected", final=True),
    ],
    transitions=[
        Transition("classified", "classify", "human-review"),
        Transition("approve", "human-review", "publish"),
        Transition("reject", "human-review", "rejected"),
        Transition("published", "publish", "done"),
    ],
)


class Spin(BaseModel):
    n: int = 0


def spin(ctx: Spin) -> dict[str, Any]:
    return {"n": ctx.n + 1}


def enough(ctx: Spin) -> bool:
    return ctx.n >= 8


spinner = Machine(
    name="spinner", context=Spin, initial="spin", max_transitions=5,
    on_loop_limit="stuck",
    states=[
        State("spin", action=spin),
        State("stuck", review=Review(prompt="It loops: go on or stop?",
                                     show=["n"], choices=["go_on", "stop"])),
        State("done", final=True),
        State("stopped", final=True, failure=True),
    ],
    transitions=[
        Transition("finished", "spin", "done", conditions=enough),
        Transition("again", "spin", "spin"),
        Transition("go_on", "stuck", "spin"),
        Transition("stop", "stuck", "stopped"),
    ],
)
