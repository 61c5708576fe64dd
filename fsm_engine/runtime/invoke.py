"""How an action is called: on the loop (``inline``), as its own coroutine, in a task
or a worker thread, under its state's timeout and the instance's deadline, and fenced by
the worker's lease where it actually starts.

Used by ``runtime.driver`` (one step); nothing here writes anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel

from ..definition.spec import Fire, State
from ..errors import InvalidInput, StepTimeout
from ..store.records import InstanceRecord
from .fence import Fence, lease_fence, run_fenced
from .step import Step
from .threads import ActionThreads, in_own_thread

__all__ = ["normalise", "start"]

Entry = tuple[Callable[..., Any], int, bool]  # (the action, its arity 1 or 2, async)


def start(entry: Entry, ctx: Any, rec: InstanceRecord, state: State, step: Step | None, *,
          threads: ActionThreads, clock: Callable[[], float],
          lease_current: Callable[[str | None], bool]) -> tuple[Awaitable[Any] | None, Any]:
    """Start the action on ``ctx``: ``(None, result)`` when it ran here (inline), else
    ``(awaitable, None)``: an ``async def`` without a timeout is its own coroutine and a
    sync action without one its worker thread's future, awaited by the caller (no task,
    no wrapper coroutine per step); the rest go through ``_cut``.  ``clock`` is epoch
    seconds (the deadline's); ``lease_current(owner)`` says whether this worker still
    holds ``rec`` (``Ownership.lease_current``)."""
    fn, arity, is_async = entry
    args: tuple[Any, ...] = (ctx, step) if arity == 2 else (ctx,)
    timeout = state.timeout
    if rec.deadline is not None:
        left = max(0.001, rec.deadline - clock())
        timeout = left if timeout is None else min(timeout, left)
    if is_async and timeout is None:  # no task needed when nothing may cut it short
        if step is not None:  # (``_stamp``, inline: the common async step)
            step.started_at = clock()
        return fn(*args), None
    if state.inline and not is_async:  # declared quick: on the loop, no thread hop
        _stamp(step, clock)
        return None, _inline(fn, args, step)
    if rec.owner is None:
        _stamp(step, clock)
    elif is_async:  # starts on a later turn of the loop: fenced where it starts
        fn = _fenced(fn, lease_fence(rec, clock, lease_current), step)
    else:  # in its thread: fenced there (one call, no closure per step)
        fn, args = run_fenced, (fn, args, rec, rec.owner, step, clock, lease_current)
    if timeout is None and not is_async:
        return threads.submit(fn, *args), None
    return _cut(fn, args, is_async, timeout, rec, state, step), None


async def _cut(fn: Callable[..., Any], args: tuple[Any, ...], is_async: bool,
               timeout: float | None, rec: InstanceRecord, state: State,
               step: Step | None) -> Any:
    """An ``async def`` action in a task (under ``timeout``, if any), or a sync one in its
    own thread under ``timeout`` (``StepTimeout`` when it fires)."""
    loop = asyncio.get_running_loop()
    if step is not None and timeout is not None:  # the model call's HTTP timeout follows
        step.llm.deadline = loop.time() + timeout
    if is_async:
        fut: asyncio.Future[Any] = asyncio.ensure_future(fn(*args))
    else:  # its own thread: a hung one is abandoned without starving the pool
        fut = in_own_thread(loop, fn, args)
    if timeout is None:
        return await fut
    done, _ = await asyncio.wait({fut}, timeout=timeout)
    if not done:
        fut.cancel()  # a thread cannot be stopped: its late result is dropped
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise StepTimeout(timeout, instance_id=rec.id, state=state.name)
    return fut.result()


def _stamp(step: Step | None, clock: Callable[[], float]) -> None:
    """``step.started_at``: an action starting now, right after the step's lease check."""
    if step is not None:
        step.started_at = clock()


def _fenced(fn: Callable[..., Any], fence: Fence, step: Step | None) -> Callable[..., Any]:
    """``async def`` ``fn`` passing ``fence`` (``runtime.fence``) where it starts, and
    setting ``step.started_at`` to its clock reading."""
    async def began(*args: Any) -> Any:
        started = fence()
        if step is not None:
            step.started_at = started
        return await fn(*args)
    return began


def _inline(fn: Callable[..., Any], args: tuple[Any, ...], step: Step | None) -> Any:
    """Call a sync action declared ``inline`` on the loop; its ``complete_sync`` raises
    instead of deadlocking the loop it would wait on."""
    if step is None:
        return fn(*args)
    step.llm.on_loop = True
    try:
        return fn(*args)
    finally:
        step.llm.on_loop = False


def normalise(result: Any) -> tuple[str | None, Mapping[str, Any]]:
    """An action's result as (trigger or None, context update)."""
    if type(result) is dict:  # the common case first
        return None, result
    if result is None:
        return None, {}
    if isinstance(result, Fire):
        return result.trigger, result.update
    if isinstance(result, dict):
        return None, result
    if isinstance(result, BaseModel):
        return None, result.model_dump()
    raise InvalidInput(f"an action returned {type(result).__name__}; "
                       "return None, a dict of updates or fire(trigger, **updates)")
