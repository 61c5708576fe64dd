"""The write side of streaming: a step's streamed model call, its pieces made durable.

``ReplyStream`` is what ``step.llm.stream(...)`` returns: an async iterator of the reply's
text pieces, with ``completion`` set once it ends.  Below it the call goes down the step's
call layers like any other (``runtime.calls``: ``Call.sink`` receives the pieces); beside it
a ``ChunkWriter`` appends the pieces to the store's stream log (``store.streams``) in small
batches, off the event loop (a thread): the first write gathers for ``FLUSH_S`` seconds and
opens the attempt with what came (a short reply is one transaction: open, text, end), and
each later one starts ``FLUSH_S`` after the one before began (at once past ``FLUSH_CHARS``
waiting), so a reader sees a piece within about ``FLUSH_S`` plus one write while a fast
model costs at most one write per ``FLUSH_S``.  These writes are appends, not steps (``ledger.py``
stays the only writer of steps); the attempt's ``end`` row is written before the call
returns, so before the step can commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from ..store.streams import StreamRow

if TYPE_CHECKING:
    from ..llm.base import Completion
    from ..store.base import Store
    from ..store.records import InstanceRecord

__all__ = ["StreamTarget", "ChunkWriter", "ReplyStream", "target", "FLUSH_S", "FLUSH_CHARS",
           "RETENTION_S"]

log = logging.getLogger("fsm_engine")

#: Longest a piece waits for the next write while one is in flight (seconds).
FLUSH_S = 0.02
#: Characters waiting that start a write at once.
FLUSH_CHARS = 2048
#: Most characters of one chunk row: the pieces of one write are merged up to this.
ROW_CHARS = 8192
#: Default retention of a committed step's stream rows (seconds; the history keeps the reply).
RETENTION_S = 3600.0
#: Least time between two prunes from one process (seconds).
PRUNE_EVERY_S = 60.0
_pruned_at = 0.0


class StreamTarget(NamedTuple):
    """Where a step's streamed calls go: ``store``, the instance, the step ``seq`` (the
    history row the step will write), ``since`` (the first seq whose open attempts a new
    attempt supersedes: earlier seqs lost to crashes, see ``target``), and how long rows
    of a committed step are kept (``retention_s``, seconds).  A ``NamedTuple``: one is
    built per step."""

    store: Any
    instance_id: str
    seq: int
    since: int
    retention_s: float = RETENTION_S


def target(store: Store, rec: InstanceRecord, retention_s: float = RETENTION_S) -> StreamTarget:
    """The stream target of the next step of ``rec``.  A takeover writes a ``recovery``
    history row, so a step rerun after a crash has a later ``seq`` than the attempt it
    replaces: ``since`` reaches back over the recoveries since the last committed step."""
    seq = rec.seq + 1
    back = rec.recoveries if rec.recoveries and rec.recovered_seq == rec.seq else 0
    return StreamTarget(store, rec.id, seq, seq - back, retention_s)


async def _io(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a thread: a stream write never stalls the event loop."""
    return await asyncio.to_thread(fn, *args)


class ChunkWriter:
    """One attempt's rows, appended in order by one background task.

    ``add`` (sync, never blocks) queues a piece; ``end``/``fail`` write what is left and
    the attempt's last row.  A store failure is logged and ends the writing (the call
    goes on: the history will hold the reply); ``attempt`` is 0 until opened.
    """

    def __init__(self, to: StreamTarget, *, json: bool = False) -> None:
        self.to, self.json = to, json
        self.attempt = 0
        self.chars = 0  # characters queued so far: the next chunk's offset
        self._pending: list[StreamRow] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._broken = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def add(self, piece: str) -> None:
        """Queue ``piece`` (its offset is the characters queued before it)."""
        if self._broken or not piece:
            return
        self._pending.append(StreamRow(self.to.instance_id, self.to.seq, 0, "chunk", piece,
                                       self.chars))
        self.chars += len(piece)
        self._wake.set()

    async def end(self, out: Completion) -> None:
        """The reply is complete: write what is left and the ``end`` row, and wait for it."""
        await self._close(StreamRow(self.to.instance_id, self.to.seq, 0, "end",
                                    info={"finish": out.finish_reason, "chars": self.chars}))

    async def fail(self, exc: BaseException) -> None:
        """The call failed: write what is left and an ``error`` row naming the error class."""
        await self._close(StreamRow(self.to.instance_id, self.to.seq, 0, "error",
                                    info={"error": type(exc).__name__}))

    def abandon(self) -> None:
        """The step was cancelled (e.g. its timeout): write what is left and an ``error``
        row in the background, without waiting."""
        self._pending.append(StreamRow(self.to.instance_id, self.to.seq, 0, "error",
                                       info={"error": "cancelled"}))
        self._closed = True
        self._wake.set()

    async def _close(self, last: StreamRow) -> None:
        self._pending.append(last)
        self._closed = True
        self._wake.set()
        with contextlib.suppress(Exception):
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self._wake.wait()  # the first piece (or the end): open with what came
            await self._pace(loop, loop.time())
            while True:
                await self._wake.wait()
                self._wake.clear()
                started = loop.time()
                rows, self._pending = merged(self._pending), []
                if not self.attempt:
                    await self._open(rows)
                elif rows:
                    await _io(self.to.store.stream_append, self.to.instance_id,
                              [_numbered(r, self.attempt) for r in rows])
                if self._closed and not self._pending:
                    return
                await self._pace(loop, started)
        except Exception as exc:  # noqa: BLE001 - streaming must not fail the call
            self._broken = True
            log.warning("stream of %s step %d: %s", self.to.instance_id, self.to.seq, exc)

    async def _pace(self, loop: asyncio.AbstractEventLoop, started: float) -> None:
        """Wait out the rest of ``FLUSH_S`` since the last write began, unless the attempt
        ends or ``FLUSH_CHARS`` wait meanwhile."""
        while not self._closed and sum(len(r.text) for r in self._pending) < FLUSH_CHARS:
            left = started + FLUSH_S - loop.time()
            if left <= 0:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)
        if self._pending or self._closed:
            self._wake.set()

    async def _open(self, rows: list[StreamRow]) -> None:
        """Open the attempt with its first ``rows`` (one transaction)."""
        info = {"json": True} if self.json else {}
        self.attempt = await _io(self.to.store.stream_open, self.to.instance_id, self.to.seq,
                                 self.to.since, info, time.time(),
                                 [_numbered(r, 0) for r in rows])
        _maybe_prune(self.to)


def merged(rows: list[StreamRow]) -> list[StreamRow]:
    """``rows`` with consecutive chunks joined up to ``ROW_CHARS`` characters a row (a
    longer piece stays whole): fewer rows for the same text and offsets."""
    out: list[StreamRow] = []
    for row in rows:
        last = out[-1] if out else None
        if (row.kind == "chunk" and last is not None and last.kind == "chunk"
                and len(last.text) + len(row.text) <= ROW_CHARS):
            out[-1] = StreamRow(last.instance_id, last.seq, last.attempt, "chunk",
                                last.text + row.text, last.offset)
        else:
            out.append(row)
    return out


def _numbered(row: StreamRow, attempt: int) -> StreamRow:
    """``row`` of ``attempt``, stamped now."""
    return StreamRow(row.instance_id, row.seq, attempt, row.kind, row.text, row.offset,
                     row.info, time.time())


def _maybe_prune(to: StreamTarget) -> None:
    """Prune committed steps' rows older than the retention, at most every
    ``PRUNE_EVERY_S`` from this process, in a thread of its own (never waited for)."""
    global _pruned_at
    now = time.time()
    if now - _pruned_at < PRUNE_EVERY_S:
        return
    _pruned_at = now

    async def prune() -> None:
        with contextlib.suppress(Exception):
            await _io(to.store.stream_prune, now - to.retention_s)
    _background.add(task := asyncio.get_running_loop().create_task(prune()))
    task.add_done_callback(_background.discard)


_background: set[asyncio.Task[None]] = set()
Sink = Callable[[str], None]


class ReplyStream:
    """``step.llm.stream(...)``: iterate it for the reply's text pieces (``str``); then
    ``completion`` holds the whole ``Completion``.  Iterate it once; leaving the loop early
    cancels the call.  Raises what the call raises (``BudgetExhausted``, ``CircuitOpen``,
    ``RateLimitWait``, a ``ProviderError``), possibly after some pieces."""

    def __init__(self, send: Callable[[Sink], Coroutine[Any, Any, tuple[Completion, bool]]],
                 writer: Callable[[], ChunkWriter | None]) -> None:
        self._send, self._writer = send, writer
        self.completion: Completion | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        return self._pieces()

    async def text(self) -> Completion:
        """Run the stream to its end without looking at the pieces; its ``Completion``."""
        async for _ in self:
            pass
        assert self.completion is not None
        return self.completion

    async def _pieces(self) -> AsyncIterator[str]:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        writer = self._writer()

        def sink(piece: str) -> None:
            queue.put_nowait(piece)
            if writer is not None:
                writer.add(piece)
        call = asyncio.get_running_loop().create_task(self._send(sink))
        call.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (piece := await queue.get()) is not None:
                yield piece
            out, streamed = await call
        except BaseException as exc:
            call.cancel()
            await _failed(writer, exc)
            raise
        if not streamed and out.text:  # answered from the cache or a fork's record
            if writer is not None:
                writer.add(out.text)
            yield out.text
        if writer is not None:
            await writer.end(out)
        self.completion = out


async def _failed(writer: ChunkWriter | None, exc: BaseException) -> None:
    """Close ``writer`` after the call raised ``exc`` (cancelled: in the background)."""
    if writer is None:
        return
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        writer.abandon()
    else:
        await writer.fail(exc)
