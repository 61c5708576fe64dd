"""Tracing as a layer: each model call an OpenTelemetry ``chat {model}`` span."""

from __future__ import annotations

from typing import Any

from ...llm.base import Completion, Message, Provider
from .layer import Layer

__all__ = ["TraceLayer"]


class TraceLayer(Layer):
    """Run ``inner.complete`` inside a client span, child of ``parent`` (an OpenTelemetry
    context) on ``tracer`` (``telemetry.traced_call``); span attributes name the
    ``provider``'s model and the call's usage."""

    def __init__(self, inner: Provider, tracer: Any, parent: Any, provider: Any) -> None:
        super().__init__(inner)
        self.tracer, self.parent, self.provider = tracer, parent, provider

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete`` (its signature), traced."""
        from ...telemetry import traced_call
        out: Completion = await traced_call(self.tracer, self.parent, self.inner.complete,
                                            self.provider, messages, kwargs)
        return out
