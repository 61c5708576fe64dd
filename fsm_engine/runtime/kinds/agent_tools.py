"""Run one tool call of an agent state: arguments in, a JSON result or an error out.

A tool never crashes the instance: an exception, a timeout, a result that is not JSON
or whose JSON is longer than ``Agent.max_result_chars`` is an error result (one line,
credentials redacted) that goes back to the model.  Retries (``Tool.retry``) happen here,
inside the call, before it is journaled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import BaseModel

from ...definition.agent import Tool, ToolCall
from ...errors import StaleWrite
from ...redaction import redact
from ..threads import ActionThreads, in_own_thread


def as_json(value: Any, limit: int) -> tuple[Any, str | None]:
    """``(value as a JSON value, None)`` (a pydantic model dumped; credentials in it
    redacted, ``fsm_engine.redaction``), or ``(None, why)`` when it is not JSON-able or its
    JSON is longer than ``limit`` characters (never retried)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:  # (RecursionError: nested too deep)
        return None, f"the result is not JSON ({type(value).__name__}): {exc}"[:1000]
    if len(text) > limit:
        return None, (f"the result is too large: {len(text)} characters of JSON, the limit "
                      f"is {limit}")
    clean = redact(text)  # a credential a tool read is neither stored nor shown the model
    try:
        return json.loads(clean), None
    except (ValueError, RecursionError):
        return clean, None


async def _once(tool: Tool, args: dict[str, Any], call: ToolCall, threads: ActionThreads,
                fence: Callable[[], object]) -> Any:
    """One attempt: the tool called with its validated arguments (and the ``ToolCall``),
    ``fence()`` first where it starts (in its thread, for a sync tool)."""
    assert tool.args is not None  # checked at load
    model = tool.args.model_validate(args)
    kwargs = {name: getattr(model, name) for name in type(model).model_fields}
    kwargs.update(dict.fromkeys(tool.call_params, call))
    if tool.is_async:
        fence()
        coro = tool.fn(**kwargs)
        if tool.timeout is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, tool.timeout)
        except TimeoutError:
            raise TimeoutError(f"tool {tool.name} took longer than {tool.timeout:g} s") from None
    fn = partial(_fenced, fence, partial(tool.fn, **kwargs))
    if tool.timeout is None:
        return await threads.submit(fn)
    fut = in_own_thread(asyncio.get_running_loop(), fn, ())
    done, _ = await asyncio.wait({fut}, timeout=tool.timeout)
    if not done:  # a thread cannot be stopped: its late result is dropped
        fut.cancel()
        raise TimeoutError(f"tool {tool.name} took longer than {tool.timeout:g} s")
    return fut.result()


def _fenced(fence: Callable[[], object], fn: Callable[[], Any]) -> Any:
    fence()
    return fn()


def _no_fence() -> float:
    return 0.0


async def run(tool: Tool, args: dict[str, Any], call: ToolCall, *, limit: int,
              threads: ActionThreads, rng: random.Random,
              fence: Callable[[], object] = _no_fence) -> tuple[Any, str | None, int]:
    """``(result, error, attempts)`` of calling ``tool``: ``error`` is ``None`` when it
    returned a JSON value (``result``), else the one-line reason. ``fence()`` is called
    where each attempt starts; the ``StaleWrite`` it raises (this worker's lease ran out)
    ends the call unrun, not as an error result."""
    attempt = 1
    while True:
        try:
            value = await _once(tool, args, dataclasses.replace(call, attempt=attempt), threads,
                                fence)
        except StaleWrite:
            raise
        except (TimeoutError, Exception) as exc:
            policy = tool.retry
            if policy is not None and policy.should_retry(attempt):
                await asyncio.sleep(policy.delay(attempt, rng=rng))
                attempt += 1
                continue
            kind = "TimeoutError" if isinstance(exc, TimeoutError) else type(exc).__name__
            return None, redact(f"{kind}: {exc}")[:1000], attempt
        result, error = as_json(value, limit)
        return result, error, attempt
