"""The innermost layer: calls the provider with the caller's input in context and bills it."""

from __future__ import annotations

from typing import Any

from ...errors import ProviderError
from ...llm.base import CALLER_INPUT, Completion, Message, Provider
from .layer import Layer
from .meter import Meter, current_call

__all__ = ["BillLayer"]


class BillLayer(Layer):
    """Call ``inner`` and bill what it reports to ``meter``.

    Around the call ``llm.base.CALLER_INPUT`` holds ``caller_input``.  A reply is billed
    its prompt + completion tokens and recorded with the call's reply key and text (and
    ``usage_missing``); a ``ProviderError`` is billed the tokens it carries and re-raised.
    The entry is left on ``current_call().entry`` for the layers above.
    """

    def __init__(self, inner: Provider, meter: Meter, caller_input: dict[str, Any] | None) -> None:
        super().__init__(inner)
        self.meter, self.caller_input = meter, caller_input

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete`` (its signature), billed."""
        call, token = current_call(), CALLER_INPUT.set(self.caller_input)
        try:
            out = await self.inner.complete(messages, **kwargs)
        except ProviderError as exc:
            call.entry = self.meter.bill(exc.prompt_tokens + exc.completion_tokens, None,
                                         repr(exc), self.inner)
            raise
        finally:
            CALLER_INPUT.reset(token)
        entry = call.entry = self.meter.bill(out.prompt_tokens + out.completion_tokens,
                                             out.finish_reason, None, self.inner, out.model)
        entry["key"], entry["reply"] = call.key, out.text
        entry["prompt_tokens"], entry["completion_tokens"] = out.prompt_tokens, out.completion_tokens
        if out.usage_missing:
            entry["usage_missing"] = True
        return out
