"""Guards (issue 10, item 6): an ``async def`` guard is a definition error naming it (a
coroutine is always truthy, so it would always pass); a guard returning a non-bool fails
its instance, recorded as such in the history, instead of passing on truthiness."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_engine import DefinitionError, Engine, Machine, State, Transition
from fsm_engine.runtime.compiled import compile_machine


class Ctx(BaseModel):
    n: int = 0


async def ready(ctx: Ctx) -> bool:
    return ctx.n > 0


class AsyncCheck:
    async def __call__(self, ctx: Ctx, run: Any) -> bool:
        return True


def machine(guard: Any, name: str = "guards") -> Machine:
    return Machine(
        name=name, context=Ctx, initial="a",
        states=[State("a"), State("yes", final=True), State("no", final=True),
                State("failed", final=True, failure=True)],
        transitions=[Transition("go", "a", "yes", conditions=guard),
                     Transition("stop", "a", "no", unless=guard)])


@pytest.mark.parametrize("guard,name", [(ready, "ready"), (AsyncCheck(), "AsyncCheck"),
                                        (functools.partial(ready), "ready")])
def test_an_async_guard_is_a_definition_error_naming_it(guard: Any, name: str) -> None:
    with pytest.raises(DefinitionError) as err:
        compile_machine(machine(guard, f"async_{name}"))
    problems = err.value.problems
    assert len(problems) == 2 and all("is async" in p for p in problems)
    assert all(name in p for p in problems)


def count(ctx: Ctx) -> int:
    return ctx.n  # an int, not a bool


def nothing(ctx: Ctx) -> None:
    return None  # a forgotten return


@pytest.mark.parametrize("guard,shown", [(count, "int: 3"), (nothing, "NoneType: None")])
def test_a_non_bool_guard_fails_its_instance_recorded_as_such(db_path: str, guard: Any,
                                                              shown: str) -> None:
    eng = Engine(db_path)
    bad = eng.start(machine(guard, f"nonbool_{guard.__name__}"), {"n": 3})
    rec = asyncio.run(eng.run(bad))
    assert (rec.status, rec.state, rec.reason) == ("failed", "failed", "error")
    assert f"guard {guard.__name__!r} returned {shown}, not a bool" in rec.last_error
    row = eng.store.history(bad)[-1]
    assert row.guards == [[guard.__name__, shown]]
    eng.close()


def test_bool_guards_still_decide(db_path: str) -> None:
    def positive(ctx: Ctx) -> bool:
        return ctx.n > 0
    eng = Engine(db_path)
    m = machine(positive, "bools")
    recs = asyncio.run(eng.run_many([eng.start(m, {"n": 1}), eng.start(m, {"n": 0})]))
    assert [r.state for r in recs] == ["yes", "no"]
    eng.close()
