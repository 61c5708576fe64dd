"""fsm_engine itself: the benchmark machines and the ``Bench`` driving them.

Three machines share the linear shape of ``bench.common``:

- ``LINEAR``: every action a plain ``def`` (the engine runs sync actions in
  its thread pool);
- ``LINEAR_ASYNC``: every action ``async def`` (runs on the event loop);
- ``SLEEPY``: plain actions except ``s2``, which awaits ``CONFIG["sleep"]``
  seconds (the simulated model call of W2/W3).  When ``FSM_BENCH_SIDEFILE``
  is set, every action appends ``instance state visit pid`` to that file
  when it completes, so W3 can count executions per (instance, state, visit).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic import BaseModel

from fsm_engine import Engine, Machine, SqliteStore, State, Step, Transition

from ..common import FINAL, INFER, STATES, TRANSITIONS

CONFIG: dict[str, Any] = {"sleep": float(os.environ.get("FSM_BENCH_SLEEP", "0.2"))}
_SIDE = os.environ.get("FSM_BENCH_SIDEFILE")
_SIDE_FD = os.open(_SIDE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if _SIDE else None


class Counter(BaseModel):
    """Instance context: how many actions have run (and, in W1 at a context size, a
    document no action changes)."""

    n: int = 0
    doc: str = ""


def bump(ctx: Counter) -> dict[str, int]:
    """Trivial action."""
    return {"n": ctx.n + 1}


async def abump(ctx: Counter) -> dict[str, int]:
    """Trivial action, async."""
    return {"n": ctx.n + 1}


async def infer(ctx: Counter) -> dict[str, int]:
    """Simulated model call: sleep, then count."""
    await asyncio.sleep(CONFIG["sleep"])
    return {"n": ctx.n + 1}


def _log(step: Step) -> None:
    if _SIDE_FD is not None:
        os.write(_SIDE_FD, f"{step.instance_id} {step.state} {step.visit} {os.getpid()}\n".encode())


def logged_bump(ctx: Counter, step: Step) -> dict[str, int]:
    """Trivial action that records its completion in the side file."""
    _log(step)
    return {"n": ctx.n + 1}


async def logged_infer(ctx: Counter, step: Step) -> dict[str, int]:
    """Simulated model call that records its completion in the side file."""
    await asyncio.sleep(CONFIG["sleep"])
    _log(step)
    return {"n": ctx.n + 1}


def linear(name: str, actions: dict[str, Any], default: Any, inline: bool = False) -> Machine:
    """The 7-state chain with ``actions[state]`` (else ``default``) on each non-final state
    (sync actions ``inline`` when asked; never the sleeping one)."""
    states = [State(s, action=actions.get(s, default), inline=inline and s not in actions)
              for s in STATES[:-1]]
    states.append(State(FINAL, final=True))
    transitions = [Transition(f"t{i}", STATES[i], STATES[i + 1]) for i in range(TRANSITIONS)]
    return Machine(name=name, states=states, transitions=transitions, initial=STATES[0],
                   context=Counter, max_transitions=20)


LINEAR = linear("bench_linear", {}, bump)
LINEAR_ASYNC = linear("bench_linear_async", {}, abump)
SLEEPY = linear("bench_sleepy", {INFER: infer}, bump)
SLEEPY_ASYNC = linear("bench_sleepy_async", {INFER: infer}, abump)
SLEEPY_LOGGED = linear("bench_sleepy_logged", {INFER: logged_infer}, logged_bump)
LINEAR_INLINE = linear("bench_linear_inline", {}, bump, inline=True)
SLEEPY_INLINE = linear("bench_sleepy_inline", {INFER: infer}, bump, inline=True)


def _check(records: list[Any]) -> None:
    bad = [r for r in records if getattr(r, "status", None) != "completed"
           or r.context["n"] != TRANSITIONS]
    if bad:
        raise AssertionError(f"{len(bad)} instance(s) did not complete: {bad[0]!r}")


class Bench:
    """fsm_engine with plain ``def`` actions on a ``SqliteStore``."""

    linear, sleepy = LINEAR, SLEEPY

    def __init__(self, path: str, synchronous: str, sleep: float) -> None:
        self.path, self.synchronous = path, synchronous
        self.doc: str | None = None  # W1 at a context size: the start input's document
        CONFIG["sleep"] = sleep

    async def open(self, workload: str) -> None:
        self.engine = Engine(SqliteStore(self.path, synchronous=self.synchronous))
        self.engine.register(self.linear)
        self.engine.register(self.sleepy)

    async def sequential(self, n: int) -> None:
        start = None if self.doc is None else {"doc": self.doc}
        for _ in range(n):
            rec = await self.engine.run(self.engine.start(self.linear, start))
            _check([rec])

    async def concurrent(self, n: int) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        ids = self.engine.start_many(self.sleepy, [None] * n)
        start_s = loop.time() - started
        _check(await self.engine.run_many(ids))
        return {"start_seconds": start_s, "run_seconds": loop.time() - started - start_s}

    async def close(self) -> None:
        await self.engine.aclose()


class BenchAsyncActions(Bench):
    """fsm_engine with ``async def`` actions (no thread-pool hop per step)."""

    linear, sleepy = LINEAR_ASYNC, SLEEPY_ASYNC


class BenchInline(Bench):
    """fsm_engine with plain ``def`` actions declared ``State(..., inline=True)`` (run on
    the event loop; the sleeping ``s2`` stays ``async def``)."""

    linear, sleepy = LINEAR_INLINE, SLEEPY_INLINE
