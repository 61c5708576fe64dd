"""Findings of the intersection matrix (``tests/test_matrix.py``), each reproduced alone
on both backends."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from fsm_engine import Machine, State, Transition
from fsm_engine.errors import InvalidInput
from pydantic import BaseModel


class Ctx(BaseModel):
    n: int = 0


def bump(ctx: Ctx) -> dict[str, Any]:
    return {"n": ctx.n + 1}


two = Machine(name="two", context=Ctx, initial="first",
              states=[State("first", action=bump), State("second", action=bump),
                      State("done", final=True)],
              transitions=[Transition("ok", "first", "second"),
                           Transition("ok", "second", "done")])


@pytest.mark.parametrize("in_place", [False, True], ids=["fork", "in-place"])
def test_rerun_of_the_initial_state(engine_factory: Callable[..., Any], in_place: bool) -> None:
    """The initial state was visited (``visits[initial] == 1``) though no row entered it:
    ``fsm rerun --state INITIAL`` / ``fsm fork --from-state INITIAL`` start over from the
    input (fork point 0) instead of refusing "never entered"."""
    engine = engine_factory()
    iid = engine.start(two, {"n": 5})
    asyncio.run(engine.run(iid))
    new = engine.rerun(iid, "first", in_place=in_place)
    rec = engine.store.get(new)
    assert (rec.state, rec.context) == ("first", {"n": 5})
    assert asyncio.run(engine.run(new)).context == {"n": 7}
    if not in_place:
        assert (rec.forked_from, rec.forked_at_seq) == (iid, 0)


def test_a_state_never_visited_is_still_refused(engine_factory: Callable[..., Any]) -> None:
    engine = engine_factory()
    iid = engine.start(two, {})
    asyncio.run(engine.step(iid))
    with pytest.raises(InvalidInput, match="never entered state 'done'"):
        engine.fork(iid, from_state="done")
