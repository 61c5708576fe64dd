"""What ``step.llm.stream(...)`` returns: ``ReplyStream``, an async iterator of the reply's
text pieces, with ``completion`` set once it ends.  Below it the call goes down the step's
call layers like any other (``runtime.calls``: ``Call.sink`` receives the pieces); beside it
a ``runtime.stream_writer.ChunkWriter`` queues them for the store's stream log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from .calls.meter import Sink, current_call, end_call
from .stream_writer import ChunkWriter

if TYPE_CHECKING:
    from contextvars import Token

    from ..llm.base import Completion, Message, Provider
    from .calls.meter import Call
    from .streams import StreamTarget

__all__ = ["ReplyStream", "Sink"]

#: ``MeteredLLM._begin``'s shape: ``(stack, provider, messages, kwargs, sink)`` → the top
#: layer and the token ending the call.
Begin = Callable[[Any, Any, "list[Message]", "dict[str, Any]", Sink],
                 "tuple[Provider, Token[Call | None]]"]


class ReplyStream:
    """``step.llm.stream(...)``: iterate it for the reply's text pieces (``str``); then
    ``completion`` holds the whole ``Completion``.  Iterate it once; leaving the loop early
    cancels the call.  Raises what the call raises (``BudgetExhausted``, ``CircuitOpen``,
    ``RateLimitWait``, a ``ProviderError``), possibly after some pieces."""

    __slots__ = ("_begin", "_head", "_messages", "_kwargs", "_to", "_json", "completion")

    def __init__(self, begin: Begin, head: tuple[Any, Any], messages: list[Message],
                 kwargs: dict[str, Any], to: StreamTarget | None, json: bool) -> None:
        # (``head``: the stack and provider ``begin`` starts the call down; ``to``: where
        # the pieces are written, None: nowhere; ``json``: the reply is JSON)
        self._begin, self._head, self._messages, self._kwargs = begin, head, messages, kwargs
        self._to, self._json = to, json
        self.completion: Completion | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        return self._pieces()

    async def _send(self, sink: Sink) -> tuple[Completion, Call]:
        """The call down the step's layers, each piece handed to ``sink``: its
        ``Completion``, and the ``Call`` (``streamed``: by the provider, not answered from a
        store; ``entry``: its ``llm_calls`` entry).  (Its writer is not told when the
        provider ended, ``ChunkWriter.provider_done``: the pieces' reader may take its
        time, and batches go on writing them meanwhile.)"""
        top, token = self._begin(*self._head, self._messages, self._kwargs, sink)
        call = current_call()
        try:
            return await top.complete(self._messages, **self._kwargs), call
        finally:
            end_call(token)

    async def text(self) -> Completion:
        """Run the stream to its end without looking at the pieces (they are still written
        for subscribers); its ``Completion``.  Awaited in the caller's task: no task, queue
        or coroutine of its own."""
        to = self._to
        writer = None if to is None else ChunkWriter(to, json=self._json)
        token = None
        try:
            top, token = self._begin(*self._head, self._messages, self._kwargs,
                                     _drop if writer is None else writer.add)
            call = current_call()
            if writer is not None:
                call.done = writer.provider_done
            out = await top.complete(self._messages, **self._kwargs)
        except BaseException as exc:
            _failed(writer, exc)
            raise
        finally:
            if token is not None:
                end_call(token)
        return self._ended(writer, out, call)

    def _ended(self, writer: ChunkWriter | None, out: Completion, call: Call) -> Completion:
        """After the call: a reply answered from the store written as one piece, the
        attempt's end queued (``ChunkWriter.end``, with the call's ``llm_calls`` entry),
        ``completion`` set."""
        if writer is not None:
            if not call.streamed:
                writer.add(out.text)
            writer.end(out, call.entry)
        self.completion = out
        return out

    async def _pieces(self) -> AsyncIterator[str]:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        writer = None if self._to is None else ChunkWriter(self._to, json=self._json)

        def sink(piece: str) -> None:
            queue.put_nowait(piece)
            if writer is not None:
                writer.add(piece)
        call = asyncio.get_running_loop().create_task(self._send(sink))
        call.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (piece := await queue.get()) is not None:
                yield piece
            out, made = await call
        except BaseException as exc:
            call.cancel()
            _failed(writer, exc)
            raise
        if not made.streamed and out.text:  # answered from the cache or a fork's record
            yield out.text
        self._ended(writer, out, made)


def _drop(piece: str) -> None:
    """A sink that keeps nothing (a step with no stream target)."""


def _failed(writer: ChunkWriter | None, exc: BaseException) -> None:
    """Close ``writer`` after the call raised ``exc`` (cancelled: by the next batch, its
    step's commit may never come)."""
    if writer is None:
        return
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        writer.abandon()
    else:
        writer.fail(exc)
