"""The innermost layer: calls the provider with the caller's input in context and bills it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import AsyncGeneratorType
from typing import Any

from ...errors import ProviderError, ServerError
from ...llm.base import CALLER_INPUT, Completion, Message, Piece, Provider
from .layer import Layer
from .meter import Call, Meter, current_call

__all__ = ["BillLayer"]


async def streamed(provider: Provider, messages: list[Message], kwargs: dict[str, Any],
                   call: Call) -> Completion:
    """``provider.stream``'s pieces handed to ``call.sink`` (read again for each piece: a
    sink may hand the call's later pieces to another, ``ReplyStream``; a ``list`` of
    pieces that arrived together is handed on as it is, in one call); its ``Completion``
    (then ``call.done``, when set, is called).  A provider that does not stream (no
    ``stream`` of its own) is called with ``complete`` and its whole reply handed over as
    one piece, and so is a call with ``tools`` (an agent turn's, OpenAI tool calling) of a
    provider whose ``stream`` does not take them (``streams_tools`` not set): its reply, tool
    calls included, reaches the stream whole.  ``ServerError`` for a stream that ends
    without its completion."""
    assert call.sink is not None
    call.streamed = True
    if getattr(type(provider), "stream", Provider.stream) is Provider.stream or (
            "tools" in kwargs and not getattr(provider, "streams_tools", False)):
        out = await provider.complete(messages, **kwargs)
        if out.text:
            call.sink(out.text)
    else:  # (read here, not in a coroutine of its own: one frame less per streamed call)
        pieces: AsyncIterator[Piece] = provider.stream(messages, **kwargs)
        last: Completion | None = None
        ended = False
        try:
            async for piece in pieces:
                if isinstance(piece, Completion):
                    last = piece
                elif piece and (sink := call.sink) is not None:
                    sink(piece)
            ended = True
        finally:  # closed at once if the step gives up: the provider's slot is freed
            if not (ended and isinstance(pieces, AsyncGeneratorType)):  # (one run to its
                await _close(pieces)                                     # end is closed)
        if last is None:
            raise ServerError(f"the stream of model {provider.model!r} ended without its reply")
        out = last
    if call.done is not None:
        call.done()
    return out


async def _close(pieces: AsyncIterator[Piece]) -> None:
    """Close the provider's ``pieces`` when they can be closed (``aclose``)."""
    close = getattr(pieces, "aclose", None)
    if close is not None:
        await close()


class BillLayer(Layer):
    """Call ``inner`` and bill what it reports to ``meter``.

    Around the call ``llm.base.CALLER_INPUT`` holds ``caller_input``.  A reply is billed
    its prompt + completion tokens and recorded with the call's reply key and text (and
    ``usage_missing``); a ``ProviderError`` is billed the tokens it carries and re-raised.
    The entry is left on ``current_call().entry`` for the layers above.  A streamed call
    (``Call.sink`` set) reads the provider's ``stream`` instead (``streamed``): every layer
    above applies to it unchanged.
    """

    def __init__(self, inner: Provider, meter: Meter, caller_input: dict[str, Any] | None) -> None:
        super().__init__(inner)
        self.meter, self.caller_input = meter, caller_input

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete`` (its signature), billed."""
        call, token = current_call(), CALLER_INPUT.set(self.caller_input)
        try:
            if call.sink is None:
                out = await self.inner.complete(messages, **kwargs)
            else:
                out = await streamed(self.inner, messages, kwargs, call)
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
