"""Machines whose kinds of step are wrong in every way ``check`` reports, for the pin of
their problem lists (``tests/definition/test_kind_pins.py``): one machine per built-in kind
and the plug-in one, and one with several kinds' problems beside others (their order)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.definition.agent import Agent
from fsm_engine.definition.fanout import Map, Parallel
from fsm_engine.definition.review import Review
from tests.helpers.cooldown_kind import Cooldown


class Ctx(BaseModel):
    n: int = 0
    items: list[int] = []


class Out(BaseModel):
    missing: int = 0


def act(ctx: Ctx) -> dict[str, Any]:
    return {}


def look(path: str) -> str:
    """Read ``path``."""
    return path


def _machine(name: str, states: list[State], transitions: list[Transition],
             **kw: Any) -> Machine:
    return Machine(name=name, context=Ctx, initial=states[0].name,
                   states=[*states, State("done", final=True)],
                   transitions=transitions, namespace=globals(), **kw)


def review() -> Machine:
    return _machine("bad_review", [State("ask", action=act, wait=True, review=Review(
        prompt="?", show=["nope"], choices=["yes", "maybe"], sla_s=-1.0, on_timeout="no"))],
        [Transition("yes", "ask", "done")])


def agent() -> Machine:
    return _machine("bad_agent", [State("loop", llm="a", review=Review("?", choices=["done"]),
                                        agent=Agent(tools=[], output=Out, llm="b",
                                                    approve=["ghost"], max_turns=0))],
                    [Transition("done", "loop", "done")])


def plugin() -> Machine:
    return _machine("bad_plugin", [State("rest", kind=Cooldown(0, then="nope")),
                                   State("mixed", wait=True, kind=Cooldown(1))],
                    [Transition("go", "rest", "mixed"), Transition("go", "mixed", "done")])


def wait() -> Machine:
    return _machine("bad_wait", [State("hold", action=act, wait=True, fallback="ghost",
                                       timeout=-1.0),
                                 State("end", final=True, wait=True)],
                    [Transition("go", "hold", "end"), Transition("go", "hold", "done")])


def fan_out() -> Machine:
    branch = Machine(name="bad_branch", context=Ctx, initial="a", namespace=globals(),
                     states=[State("a", action="no_such"), State("z", final=True)],
                     transitions=[Transition("go", "a", "nowhere")])
    return _machine("bad_fan", [
        State("par", action=act, fan_out=Parallel({"x": branch, "": act}, into="ghost",
                                                  max_concurrency=0)),
        State("map", fan_out=Map(items="ghost", machine=act, item_field="nope")),
        State("odd", fan_out="not a fan-out")],  # type: ignore[arg-type]
        [Transition("go", "par", "map"), Transition("joined", "map", "odd"),
         Transition("go", "odd", "done")])


def timers() -> Machine:
    return _machine("bad_timer", [State("work", action=act), State("hold", wait=True)],
                    [Transition("go", "work", "hold", after=5.0),
                     Transition("late", "hold", "done", after=-1.0)])


def mixed() -> Machine:
    """Kinds' problems beside a guard's, a version's and an unknown route's."""
    return _machine("bad_mixed", [
        State("fan", fan_out=Map(items="ghost", machine=act, into="items")),
        State("ask", review=Review("?", choices=["nope"])),
        State("hold", wait=True, action=act),
        State("rest", kind=Cooldown(-1, then="go"))],
        [Transition("joined", "fan", "ask"), Transition("ok", "ask", "hold",
                                                         conditions="no_guard"),
         Transition("go", "hold", "rest"), Transition("go", "rest", "done")],
        version=0, on_loop_limit="hold")


BROKEN = {"review": review, "agent": agent, "plugin": plugin, "wait": wait,
          "fan_out": fan_out, "timers": timers, "mixed": mixed}
