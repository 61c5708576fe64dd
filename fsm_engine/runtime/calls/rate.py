"""The shared rate limit as a layer: room taken before the call, settled at what it billed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ProviderError, RateLimitWait
from ...llm.base import Completion, Message, Provider
from .layer import Layer
from .meter import Meter, count_prompt, current_call, store_io

if TYPE_CHECKING:
    from ..fleet.rates import RateLimiter

__all__ = ["RateLimitLayer"]


class RateLimitLayer(Layer):
    """Take ``prompt + max_tokens`` tokens of room from the model's shared rate limit
    (``limiter(provider)``, looked up per call: None, not limited), call ``inner``, then
    settle the ticket at the tokens the reply (or the ``ProviderError``) billed.

    A full limit raises ``RateLimitWait`` before anything is sent and is kept on
    ``meter.rate_wait`` (the step then waits durably, whatever the action did with it).
    The prompt is the one a layer above counted, else counted here.
    """

    def __init__(self, inner: Provider, limiter: Callable[[Any], RateLimiter | None],
                 provider: Any, meter: Meter) -> None:
        super().__init__(inner)
        self.limiter, self.provider, self.meter = limiter, provider, meter

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete`` (its signature) within the rate limit."""
        limiter = self.limiter(self.provider)
        if limiter is None:
            return await self.inner.complete(messages, **kwargs)
        call = current_call()
        if call.prompt is None:
            call.prompt = await count_prompt(self.provider, messages)
        try:
            ticket = await store_io(limiter.store, limiter.acquire,
                                    call.prompt + int(kwargs.get("max_tokens", 256)))
        except RateLimitWait as exc:
            self.meter.rate_wait = exc
            raise
        try:
            out = await self.inner.complete(messages, **kwargs)
        except ProviderError as exc:
            await store_io(limiter.store, limiter.settle, ticket,
                           exc.prompt_tokens + exc.completion_tokens)
            raise
        await store_io(limiter.store, limiter.settle, ticket, out.prompt_tokens + out.completion_tokens)
        return out
