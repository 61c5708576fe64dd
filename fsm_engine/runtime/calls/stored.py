"""Replies answered from the store as layers: a fork's recorded replies, the reply cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...llm.base import Completion, Message, Provider
from .layer import Layer
from .meter import Meter, current_call, store_io

if TYPE_CHECKING:
    from ..reply_cache import RecordedReplies, ReplyCache

__all__ = ["ReplayLayer", "CacheLayer"]


async def _answered(source: ReplyCache | RecordedReplies, meter: Meter, provider: Any,
                    mark: str) -> Completion | None:
    """The stored reply to the current call (billed 0 tokens, its entry marked ``mark``), or
    None."""
    call = current_call()
    key = call.key
    hit = await store_io(source.store, source.get, key)
    if hit is not None:  # answered from the store: no tokens, no breaker, no call
        entry = call.entry = meter.bill(0, hit.finish_reason, None, provider, hit.model)
        entry.update({mark: True, "key": key, "reply": hit.text})
    return hit


class ReplayLayer(Layer):
    """A fork's (``fsm fork --reuse-llm``) calls answered by the original's recorded reply
    under the same key (``replayed`` in ``llm_calls``); other calls go to ``inner``."""

    def __init__(self, inner: Provider, recorded: RecordedReplies, meter: Meter,
                 provider: Any) -> None:
        super().__init__(inner)
        self.recorded, self.meter, self.provider = recorded, meter, provider

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """The recorded reply, else ``inner.complete`` (its signature)."""
        hit = await _answered(self.recorded, self.meter, self.provider, "replayed")
        return hit if hit is not None else await self.inner.complete(messages, **kwargs)


class CacheLayer(Layer):
    """Calls answered from the state's reply cache (``cached`` in ``llm_calls``); a miss
    goes to ``inner`` and its reply is stored under the call's key."""

    def __init__(self, inner: Provider, cache: ReplyCache, meter: Meter, provider: Any) -> None:
        super().__init__(inner)
        self.cache, self.meter, self.provider = cache, meter, provider

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """The cached reply, else ``inner.complete`` (its signature), then cached."""
        hit = await _answered(self.cache, self.meter, self.provider, "cached")
        if hit is not None:
            return hit
        out = await self.inner.complete(messages, **kwargs)
        await store_io(self.cache.store, self.cache.put, current_call().key, self.provider, out)
        return out
