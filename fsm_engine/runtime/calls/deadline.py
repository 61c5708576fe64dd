"""The step's timeout as a layer: a provider that takes ``timeout`` gets the seconds left."""

from __future__ import annotations

import asyncio
from typing import Any

from ...llm.base import Completion, Message, Provider
from .layer import Layer
from .meter import Meter

__all__ = ["DeadlineLayer"]


class DeadlineLayer(Layer):
    """Pass ``timeout`` (seconds until ``meter.deadline``, at least 1 ms) to ``inner`` when
    the step has a deadline and the caller gave no ``timeout``.  Composed only over a
    provider whose ``complete`` takes ``timeout`` (``llm.base.accepts_timeout``)."""

    def __init__(self, inner: Provider, meter: Meter) -> None:
        super().__init__(inner)
        self.meter = meter

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete`` (its signature) with the time left."""
        deadline = self.meter.deadline
        if deadline is not None and "timeout" not in kwargs:
            kwargs["timeout"] = max(0.001, deadline - asyncio.get_running_loop().time())
        return await self.inner.complete(messages, **kwargs)
