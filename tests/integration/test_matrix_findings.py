"""Findings of the intersection matrix (``tests/integration/test_matrix.py``), each reproduced alone
on both backends."""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
from background_worker import Background, until
from pydantic import BaseModel

from fsm_engine import Machine, State, Transition
from fsm_engine.errors import InvalidInput


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


# -- a worker whose loop stalled past its lease starts the next step anyway -----------------
_SHARED = sys.modules.setdefault("matrix_findings_shared", types.ModuleType("shared"))
if not hasattr(_SHARED, "RAN"):
    _SHARED.RAN = []  # type: ignore[attr-defined]
#: ``(instance id, state, thread name)`` of every run of ``relay``'s actions, in order.
RAN: list[tuple[str, str, str]] = _SHARED.RAN  # type: ignore[attr-defined]


def note(ctx: Ctx, step: Any) -> dict[str, Any]:
    RAN.append((step.instance_id, step.state, threading.current_thread().name))
    return {"n": ctx.n + 1}


relay = Machine(name="relay", context=Ctx, initial="first",
                states=[State("first", action=note, inline=True),
                        State("second", action=note, inline=True), State("done", final=True)],
                transitions=[Transition("ok", "first", "second"),
                             Transition("ok", "second", "done")])
machine = relay  # what a worker loading this file by path runs


def test_a_stalled_worker_does_not_start_a_step_after_its_lease(engine_factory: Any) -> None:
    """Worker A commits ``first``, then its event loop stalls (a long GC pause, SIGSTOP)
    past its lease; worker B takes the instance over and runs ``second`` to the end. When
    A's loop goes on it must not start ``second`` again: the step is committed (by B), and
    A's lease ran out before it began — only an action already running may finish."""
    a, b = engine_factory(lease_seconds=1.0), engine_factory(lease_seconds=1.0)
    RAN.clear()
    iid = a.start(relay, {})
    real = a.store.commit

    def commit_then_stall(steps: Any) -> Any:
        done = real(steps)
        if any(h.source == "first" for s in steps for h in s.history):
            # A's loop is stuck here until B, waiting meanwhile, has finished the instance
            until(lambda: b.store.get(iid).final, "B to take over and finish it")
        return done
    a.store.commit = commit_then_stall  # type: ignore[method-assign]
    other = Background(b)
    try:
        asyncio.run(asyncio.wait_for(a.run(iid), 30))
    except Exception:  # noqa: BLE001 - A lost the instance: what it ran is the point
        pass
    finally:
        other.stop()
    seconds = [r for r in RAN if r[1] == "second"]
    assert len(seconds) == 1, f"'second' ran {len(seconds)} times: {RAN}"


# -- M3: an action dispatched before a stall starts after it, on a lost lease ---------------
def slow_note(ctx: Ctx, step: Any) -> dict[str, Any]:  # a thread's action (not inline)
    RAN.append((step.instance_id, step.state, threading.current_thread().name))
    return {"n": ctx.n + 1}


async def async_note(ctx: Ctx, step: Any) -> dict[str, Any]:  # a task's (it has a timeout)
    RAN.append((step.instance_id, step.state, "task"))
    return {"n": ctx.n + 1}


threaded = Machine(name="threaded", context=Ctx, initial="first",
                   states=[State("first", action=slow_note), State("done", final=True)],
                   transitions=[Transition("ok", "first", "done")])
tasked = Machine(name="tasked", context=Ctx, initial="first",
                 states=[State("first", action=async_note, timeout=30.0),
                         State("done", final=True)],
                 transitions=[Transition("ok", "first", "done")])


@pytest.mark.parametrize("spec", [threaded, tasked], ids=["thread", "task"])
def test_an_action_dispatched_before_a_stall_does_not_start_after_it(
        engine_factory: Any, spec: Machine) -> None:
    """Matrix finding M3. A sync action goes to a thread, an ``async def`` under a timeout to
    a task: both start on a later turn of the event loop than the lease check before them.
    A worker stopped in between (SIGSTOP while its loop made another instance's commit, the
    matrix's ``child-stop`` cells) and taken over meanwhile must not start the action when
    it goes on: the lease is checked again where the action starts, and the step ends in
    ``StaleWrite`` with nothing run and nothing committed."""
    engine = engine_factory(lease_seconds=1.0)
    RAN.clear()
    iid = engine.start(spec, {})
    answers = iter([True])  # current at the step's check; lost by the time the action starts
    engine.driver.lease_current = lambda owner: next(answers, False)
    from fsm_engine.errors import StaleWrite
    with pytest.raises(StaleWrite, match="lease"):
        asyncio.run(engine.step(iid))
    assert RAN == []
    rec = engine.store.get(iid)
    assert (rec.state, rec.context, len(engine.store.history(iid))) == ("first", {"n": 0}, 0)
