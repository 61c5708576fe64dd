"""The base of every call layer: a ``Provider`` that wraps an ``inner`` one."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from ...llm.base import Completion, Message, Provider

__all__ = ["Layer"]


class Layer(Provider):
    """A provider over ``inner`` (a provider or another layer): ``name``, ``model``,
    ``count_tokens`` and ``aclose`` are ``inner``'s; a subclass overrides ``complete``,
    awaiting ``self.inner.complete(messages, **kwargs)`` directly (no task, no extra
    coroutine)."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        """The wrapped provider's kind."""
        return self.inner.name

    @name.setter
    def name(self, value: str) -> None:
        self.inner.name = value

    @property
    def model(self) -> str:
        """The wrapped provider's model (which it may learn only at its first call)."""
        return self.inner.model

    @model.setter
    def model(self, value: str) -> None:
        self.inner.model = value

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete(messages, **kwargs)``."""
        return await self.inner.complete(messages, **kwargs)

    def count_tokens(self, messages: list[Message]) -> int | Awaitable[int]:
        """``inner``'s count (its tokenizer, or the estimate)."""
        count = getattr(self.inner, "count_tokens", None)
        return count(messages) if count is not None else super().count_tokens(messages)

    async def aclose(self) -> None:
        """Close ``inner``."""
        await self.inner.aclose()
