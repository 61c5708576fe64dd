"""The circuit breaker as a layer: refuse while open, record each call's outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ProviderError
from ...llm.base import Completion, Message, Provider

if TYPE_CHECKING:
    from ..fleet.breaker import Breaker

from .layer import Layer

__all__ = ["BreakerLayer"]


class BreakerLayer(Layer):
    """``breaker.before_call()`` (raises ``CircuitOpen`` before anything is sent), then
    ``inner``; a reply records a success, a retryable ``ProviderError`` a failure (a
    non-retryable one, e.g. a 400, says nothing about the model's health)."""

    def __init__(self, inner: Provider, breaker: Breaker) -> None:
        super().__init__(inner)
        self.breaker = breaker

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete`` (its signature) behind the breaker."""
        await self.breaker.before_call()
        try:
            out = await self.inner.complete(messages, **kwargs)
        except ProviderError as exc:
            if exc.retryable:
                await self.breaker.record(False)
            raise
        await self.breaker.record(True)
        return out
