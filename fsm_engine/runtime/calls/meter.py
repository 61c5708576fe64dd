"""Per-step accounting shared by a step's call layers, and the per-call record they pass down.

``Meter`` is the one mutable value of a step's model calls: tokens billed (``used``),
the ``detail.llm_calls`` entries (``calls``), the rate-limit wait a call met
(``rate_wait``) and the step's deadline.  ``Call`` is what one call carries past
the provider's signature (its reply key, its counted prompt, its ``llm_calls``
entry), reached through ``current_call()`` (a context variable, so concurrent calls
of one step each see their own).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...errors import RateLimitWait
from ...llm.base import estimate_prompt_tokens

__all__ = ["Meter", "Call", "Sink", "current_call", "count_prompt", "store_io"]

T = TypeVar("T")
log = logging.getLogger("fsm_engine")


#: What a streamed call hands each text piece to (``Call.sink``): a ``str``, or a ``list`` of
#: the pieces that arrived together (``llm.base.Piece``), in order.
Sink = Callable[[str | list[str]], None]


@dataclass(slots=True)
class Call:
    """One model call on its way down the layers.

    ``key``: the reply key (``runtime.reply_cache.reply_key`` of the call as the action
    made it); ``prompt``: its prompt tokens once a layer counted them (None: not yet);
    ``entry``: its ``detail.llm_calls`` entry once billed (None: not yet);
    ``sink``: set for a streamed call (``MeteredLLM.stream``): ``BillLayer`` then reads the
    provider's ``stream`` and hands each text piece to it, and sets ``streamed`` (a call
    answered above the provider, from a cache or a fork's record, never reaches it);
    ``done``: called once the provider's stream has ended with its reply (before the
    layers above return).
    """

    key: str
    prompt: int | None = None
    entry: dict[str, Any] | None = None
    sink: Sink | None = None
    streamed: bool = False
    done: Callable[[], None] | None = None


_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("fsm_call", default=None)


def current_call() -> Call:
    """The call being made in this context (a fresh keyless one outside ``Meter.calling``)."""
    call = _CALL.get()
    return call if call is not None else Call("")


@dataclass(slots=True)
class Meter:
    """What a step's model calls cost and recorded (mutable; one per step).

    ``used``: tokens billed (prompt + completion), failed calls included; ``calls``: the
    ``detail.llm_calls`` entries; ``rate_wait``: set when a call found its rate limit
    full; ``deadline``: ``loop.time()`` when the step's timeout fires (None: none).
    """

    used: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    rate_wait: RateLimitWait | None = None
    deadline: float | None = None

    def bill(self, tokens: int, finish: str | None, error: str | None, provider: Any,
             answered_by: str | None = None) -> dict[str, Any]:
        """Count a call's ``tokens``; append and return its ``llm_calls`` entry (it names
        the model: ``"{provider.name}:{model}"``)."""
        self.used += tokens
        model = answered_by or getattr(provider, "model", None)
        entry: dict[str, Any] = {"tokens": tokens, "finish_reason": finish, "error": error,
                                 "model": f"{getattr(provider, 'name', 'llm')}:{model}"}
        self.calls.append(entry)
        return entry

    def calling(self, key: str, sink: Sink | None = None
                ) -> contextvars.Token[Call | None]:
        """Start a call with reply ``key`` (``_CALL.reset(token)`` ends it); ``sink``: see
        ``Call``."""
        return _CALL.set(Call(key, sink=sink))


def end_call(token: contextvars.Token[Call | None]) -> None:
    """End the call ``Meter.calling`` started."""
    _CALL.reset(token)


async def count_prompt(provider: Any, messages: list[dict[str, str]]) -> int:
    """The prompt's tokens by ``provider.count_tokens`` (sync or async), else (or when that
    fails or answers no count) the conservative ``llm.base.estimate_prompt_tokens``."""
    count = getattr(provider, "count_tokens", None)
    if count is not None:
        try:
            n = count(messages)
            n = await n if inspect.isawaitable(n) else n
            if isinstance(n, int) and n >= 0:
                return n
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure must not fail the call
            log.debug("count_tokens failed (%s); using the estimate", exc)
    return estimate_prompt_tokens(messages)


async def store_io(store: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: in a thread when ``store`` waits on a network (``Store.remote``), so
    a model call's rate-limit and reply-cache round trips never stall the event loop;
    inline for a local file, where the thread hand-off would cost more than the call."""
    if getattr(store, "remote", False):
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
