"""Machines for the fan-out tests (a module of its own: worker processes load it by path)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.definition.fanout import Branch, Completion, Map, Parallel


class Item(BaseModel):
    word: str
    out: str = ""


async def shout(ctx: Item, step) -> dict:
    """``fail`` fails for good, ``slow`` sleeps 30 s (until cancelled), ``llm`` calls the model."""
    if ctx.word == "fail":
        raise ValueError("this item fails")
    if ctx.word == "slow":
        await asyncio.sleep(30)
    if ctx.word.startswith("llm"):
        reply = await step.llm.complete([{"role": "user", "content": ctx.word}], max_tokens=20)
        return {"out": reply.text}
    return {"out": ctx.word.upper()}


item = Machine(name="item", context=Item, initial="go", max_transitions=5,
               states=[State("go", action=shout), State("done", final=True),
                       State("failed", final=True, failure=True)],
               transitions=[Transition("ok", "go", "done")])


class Parent(BaseModel):
    words: list[str] = []
    results: list[dict | None] = []
    count: int = 0
    a: str = ""
    b: str = ""
    both: dict = {}


def _machine(policy: Completion | str = "all_successful", reducer=None, into="results",
             max_concurrency=None, skippable=False, name="fan") -> Machine:
    branch = Branch(item, skippable=skippable, default_output={"word": "?", "out": "skipped"}) \
        if skippable else item
    return Machine(
        name=name, context=Parent, initial="start", max_transitions=20, token_budget=None,
        states=[State("start", action=lambda ctx: None),
                State("map", fan_out=Map(items="words", machine=branch, item_field="word",
                                         into=into, reducer=reducer, completion=policy,
                                         max_concurrency=max_concurrency)),
                State("done", final=True), State("broken", final=True, failure=True),
                State("over", final=True, failure=True)],
        transitions=[Transition("go", "start", "map"), Transition("joined", "map", "done"),
                     Transition("branch_failed", "map", "broken"),
                     Transition("budget_exhausted", "map", "over")])


fan = _machine()
fan_completed = _machine("all_completed", name="fan_completed")
fan_first = _machine("first_successful", name="fan_first")
fan_min2 = _machine(Completion(min_successful=2), name="fan_min2")
fan_tol1 = _machine(Completion(tolerated_failures=1), name="fan_tol1")
fan_ratio = _machine(Completion(tolerated_failure_ratio=0.2), name="fan_ratio")
fan_one_at_a_time = _machine(max_concurrency=1, name="fan_serial")
fan_skip = _machine(skippable=True, name="fan_skip")


def _boom(outputs):
    raise RuntimeError("no digest today")


fan_boom = _machine(reducer=_boom, name="fan_boom")
fan_bad_output = _machine(reducer=lambda outs: "not a list", name="fan_bad_output")
fan_count = _machine(reducer=lambda outs: {"count": len(outs)}, into=None, name="fan_count")


def many(ctx: Parent) -> bool:
    """The join's guard: more than two results (read after the join's update)."""
    return len(ctx.results) > 2


def _routed(name: str, fallback: bool) -> Machine:
    """A ``Map`` whose ``joined`` routes on the children's results (``many``), with an
    unguarded ``joined`` edge after it when ``fallback``."""
    return Machine(
        name=name, context=Parent, initial="map", max_transitions=20,
        states=[State("map", fan_out=Map(items="words", machine=item, item_field="word",
                                         into="results")),
                State("big", final=True), *([State("done", final=True)] if fallback else []),
                State("broken", final=True, failure=True)],
        transitions=[Transition("joined", "map", "big", conditions=many),
                     *([Transition("joined", "map", "done")] if fallback else []),
                     Transition("branch_failed", "map", "broken")])


fan_routed = _routed("fan_routed", fallback=True)
fan_routed_only = _routed("fan_routed_only", fallback=False)


def left(ctx: Parent) -> dict:
    return {"a": "left"}


def right(ctx: Parent) -> dict:
    return {"b": "right"}


pair = Machine(
    name="pair", context=Parent, initial="both",
    states=[State("both", fan_out=Parallel(branches={"l": left, "r": Branch(right)},
                                           into="both")),
            State("done", final=True)],
    transitions=[Transition("joined", "both", "done")])

machine = fan


# -- a family two levels deep: top -> groups (own call, then a Map of items) -> items --------
class Group(BaseModel):
    words: list[str] = []
    results: list[dict | None] = []
    said: str = ""


async def say(ctx: BaseModel, step) -> dict:
    """The instance's own model call (before its fan-out)."""
    reply = await step.llm.complete([{"role": "user", "content": "own call"}], max_tokens=20)
    return {"said": reply.text}


def _deep(name: str, context: type, items: str, branch, *, budget=None,
          concurrency: int | None = 1) -> Machine:
    return Machine(
        name=name, context=context, initial="call", max_transitions=20, token_budget=budget,
        states=[State("call", action=say),
                State("map", fan_out=Map(items=items, machine=branch, item_field=None
                                         if items == "groups" else "word", into="results",
                                         max_concurrency=concurrency)),
                State("done", final=True), State("broken", final=True, failure=True),
                State("over", final=True, failure=True)],
        transitions=[Transition("ok", "call", "map"), Transition("budget_exhausted", "call", "over"),
                     Transition("joined", "map", "done"),
                     Transition("branch_failed", "map", "broken"),
                     Transition("budget_exhausted", "map", "over")])


class Top(BaseModel):
    groups: list[dict] = []
    results: list[dict | None] = []
    said: str = ""


group = _deep("group", Group, "words", item)
group_capped = _deep("group_capped", Group, "words", item, budget=60)
deep = _deep("deep", Top, "groups", group)
deep_both = _deep("deep_both", Top, "groups", group, concurrency=2)
deep_capped = _deep("deep_capped", Top, "groups", group_capped)
