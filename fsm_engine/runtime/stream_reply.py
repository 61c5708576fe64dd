"""What ``step.llm.stream(...)`` returns: ``ReplyStream``, an async iterator of the reply's
text pieces, with ``completion`` set once it ends (or, without the loop, ``await
.complete()`` for the ``Completion``, ``await .text()`` for its text).  Below it the call
goes down the step's call layers like any other (``runtime.calls``: ``Call.sink`` receives
the pieces); beside it a ``runtime.stream_writer.ChunkWriter`` queues them for the store's
stream log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ..errors import FsmError
from .calls.meter import Call, Sink, current_call, end_call
from .stream_writer import ChunkWriter, next_serial

if TYPE_CHECKING:
    from contextvars import Token

    from ..llm.base import Completion, Message, Provider
    from .streams import StreamTarget

__all__ = ["ReplyStream", "Sink"]

#: ``MeteredLLM._begin``'s shape: ``(stack, provider, messages, kwargs, sink)`` → the top
#: layer and the token ending the call.
Begin = Callable[[Any, Any, "list[Message]", "dict[str, Any]", Sink],
                 "tuple[Provider, Token[Call | None]]"]


class ReplyStream:
    """``step.llm.stream(...)``: iterate it for the reply's text pieces (``str``); then
    ``completion`` holds the whole ``Completion``.  Or no loop: ``await .complete()`` returns
    the ``Completion`` (as ``step.llm.complete`` does), ``await .text()`` its text (``str``);
    the pieces are streamed to subscribers all the same.  Read it once (``async for``,
    ``complete()`` or ``text()``: one call; a second read raises ``FsmError``); leaving the
    loop early cancels the call.  Raises what the call raises (``BudgetExhausted``, ``CircuitOpen``,
    ``RateLimitWait``, a ``ProviderError``), possibly after some pieces."""

    __slots__ = ("_begin", "_head", "_messages", "_kwargs", "_to", "_json", "completion",
                 "_writer", "_serial", "_call", "_read")

    def __init__(self, begin: Begin, head: tuple[Any, Any], messages: list[Message],
                 kwargs: dict[str, Any], to: StreamTarget | None, json: bool) -> None:
        # (``head``: the stack and provider ``begin`` starts the call down; ``to``: where
        # the pieces are written, None: nowhere; ``json``: the reply is JSON)
        self._begin, self._head, self._messages, self._kwargs = begin, head, messages, kwargs
        self._to, self._json = to, json
        self.completion: Completion | None = None
        self._writer: ChunkWriter | None = None  # (``complete``: opened by its first row)
        self._serial = 0
        self._call: Call | None = None
        self._read = False

    def __aiter__(self) -> AsyncIterator[str]:
        self._once()
        return self._pieces()

    def _once(self) -> None:
        """Mark the stream read; ``FsmError`` when it was (a second read would be a second
        call, and ``text()`` twice wrote both calls' pieces as one attempt)."""
        if self._read:
            raise FsmError("this step.llm.stream(...) was already read: it is one model "
                           "call, read once (async for, await .complete() or await .text())")
        self._read = True

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

    async def text(self) -> str:
        """The whole reply's text (``str``; ``completion`` then holds its ``Completion``):
        ``complete()``'s ``.text``."""
        return (await self.complete()).text

    async def complete(self) -> Completion:
        """Run the stream to its end without looking at the pieces (they are still written
        for subscribers); its ``Completion``, as ``step.llm.complete`` returns it.  Awaited
        in the caller's task: no task, queue or coroutine of its own.  The stream's own sink
        is this object (``__call__``): its writer is opened by its first row (a piece, the
        end or an error; numbered in the order the calls began all the same), so a call
        waiting for the model's first token holds no writer, list or bound method
        meanwhile."""
        self._once()
        token = None
        if self._to is not None:
            self._serial = next_serial()
        try:
            top, token = self._begin(*self._head, self._messages, self._kwargs,
                                     _drop if self._to is None else self)
            call = self._call = current_call()
            out = await top.complete(self._messages, **self._kwargs)
        except BaseException as exc:
            _failed(self._open(), exc)
            raise
        finally:
            if token is not None:
                end_call(token)
        return self._ended(self._writer or self._open(), out, call)

    def __call__(self, piece: str | list[str]) -> None:
        """``complete``'s sink for the call's first piece: opens the writer and hands it the
        call's later pieces directly (``Call.sink``), and the provider's end
        (``Call.done``)."""
        writer, call = self._open(), self._call  # (the sink only with a target, once the
        assert writer is not None and call is not None  # call began)
        call.sink, call.done = writer.add, writer.provider_done
        writer.add(piece)

    def _open(self) -> ChunkWriter | None:
        """``complete``'s writer, opened now if it was not (None: no stream target)."""
        writer = self._writer
        if writer is None and self._to is not None:
            writer = self._writer = ChunkWriter(self._to, json=self._json, serial=self._serial)
        return writer

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

        def sink(piece: str | list[str]) -> None:
            if isinstance(piece, str):
                queue.put_nowait(piece)
            else:  # (pieces that arrived together: the caller still gets each one)
                for p in piece:
                    if p:
                        queue.put_nowait(p)
            if writer is not None:
                writer.add(piece)
        call = asyncio.get_running_loop().create_task(self._send(sink))
        call.add_done_callback(lambda _: queue.put_nowait(None))
        if writer is not None:  # (a reader leaving early: its step's commit ends the attempt)
            writer.ending = lambda: self._left(writer, call)
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

    def _left(self, writer: ChunkWriter, call: asyncio.Task[tuple[Completion, Call]]) -> None:
        """``writer.ending`` of an ``async for`` its reader left, at its step's commit: the
        attempt ends as its call did (its reply, or its error); a call still running is
        cancelled (as the generator's close would, on a later turn of the event loop)."""
        if not call.done():
            call.cancel()
            return
        if call.cancelled():
            return
        exc = call.exception()
        if exc is not None:
            writer.fail(exc)
        else:
            self._ended(writer, *call.result())


def _drop(piece: str | list[str]) -> None:
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
