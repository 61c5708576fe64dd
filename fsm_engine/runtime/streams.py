"""The write side of streaming: a step's streamed model call, its pieces made durable.

``ReplyStream`` is what ``step.llm.stream(...)`` returns: an async iterator of the reply's
text pieces, with ``completion`` set once it ends.  Below it the call goes down the step's
call layers like any other (``runtime.calls``: ``Call.sink`` receives the pieces); beside it
a ``ChunkWriter`` queues the pieces for the store's stream log (``store.streams``), and the
engine's ``Batcher`` writes the rows of every attempt streaming in the process together:
the first batch ``FLUSH_S`` seconds after a row waits (a short reply is one op: open, text,
end), then at most one per ``FLUSH_S`` (sooner past ``FLUSH_CHARS`` waiting), so a reader
sees a piece within about ``FLUSH_S`` plus one write and a fast model costs at most one
transaction per ``FLUSH_S`` however many instances stream.  These writes are appends, not
steps (``ledger.py`` stays the only writer of steps); the attempt's ``end`` row is written
before the call returns, so before the step can commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from ..store.streams import StreamOp, StreamRow

if TYPE_CHECKING:
    from ..llm.base import Completion
    from ..store.base import Store
    from ..store.records import InstanceRecord

__all__ = ["StreamTarget", "Streams", "Batcher", "ChunkWriter", "ReplyStream", "FLUSH_S",
           "FLUSH_CHARS", "RETENTION_S"]

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
    of a committed step are kept (``retention_s``, seconds), and the ``batcher`` its rows
    go through (None: one of its own).  A ``NamedTuple``: one is built per step."""

    store: Any
    instance_id: str
    seq: int
    since: int
    retention_s: float = RETENTION_S
    batcher: Batcher | None = None


class Streams:
    """Where one driver's steps stream: its ``store``, one ``Batcher`` for all of them, and
    ``retention_s``, the seconds a committed step's rows are kept (default 1 h)."""

    def __init__(self, store: Store, retention_s: float = RETENTION_S) -> None:
        self.store, self.retention_s = store, retention_s
        self.batcher = Batcher(store)

    def target(self, rec: InstanceRecord) -> StreamTarget:
        """The stream target of the next step of ``rec``.  A takeover writes a ``recovery``
        history row, so a step rerun after a crash has a later ``seq`` than the attempt it
        replaces: ``since`` reaches back over the recoveries since the last committed
        step."""
        seq = rec.seq + 1
        back = rec.recoveries if rec.recoveries and rec.recovered_seq == rec.seq else 0
        return StreamTarget(self.store, rec.id, seq, seq - back, self.retention_s, self.batcher)


class Batcher:
    """The stream writes of one store, batched across every attempt streaming in this process
    (a group commit for stream rows): one ``Store.stream_write`` transaction carries every
    writer's pending rows.  A batch starts ``FLUSH_S`` after the first row waits (sooner
    once ``FLUSH_CHARS`` wait) and at most every ``FLUSH_S``; one is in flight at a time.
    On a local store (SQLite) it is written on the event loop, as the group committer
    does: measured, a thread hop per write and the connection's lock cost more than the
    write; on a remote one (PostgreSQL) in a thread.  Bound to the running event loop
    (rebuilt for another)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.offload = bool(getattr(store, "remote", False))
        self._dirty: dict[ChunkWriter, None] = {}  # writers with rows waiting, in order
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writing = False
        self._last = 0.0  # loop time the last batch began
        self.batches = 0

    def wake(self, writer: ChunkWriter, *, soon: bool = False) -> None:
        """``writer`` has rows waiting (``soon``: many, or its last one)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._dirty, self._timer, self._writing = loop, {}, None, False
        self._dirty[writer] = None
        if self._writing:
            return
        due = self._last + FLUSH_S if soon else max(self._last + FLUSH_S, loop.time() + FLUSH_S)
        if self._timer is not None and (not soon or self._timer.when() <= due):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(max(loop.time(), due), self._start)

    def _start(self) -> None:
        self._timer = None
        if not self._dirty or self._writing:
            return
        assert self._loop is not None
        self._last = self._loop.time()
        writers, self._dirty = list(self._dirty), {}
        ops = [w.take() for w in writers]
        if not self.offload:
            self._done(writers, ops, self._apply(ops))
            return
        self._writing = True
        self._loop.create_task(self._offloaded(writers, ops))

    async def _offloaded(self, writers: list[ChunkWriter], ops: list[StreamOp]) -> None:
        try:
            self._done(writers, ops, await _thread(self._apply, ops))
        finally:
            self._writing = False
            if self._dirty:
                self.wake(next(iter(self._dirty)), soon=True)

    def _apply(self, ops: list[StreamOp]) -> list[int] | BaseException:
        """Write ``ops`` in one transaction: what each gave, or the error."""
        try:
            return list(self.store.stream_write(ops))
        except Exception as exc:  # noqa: BLE001 - streaming must not fail the call
            return exc

    def _done(self, writers: list[ChunkWriter], ops: list[StreamOp],
              out: list[int] | BaseException) -> None:
        """Tell each writer what its op gave; start the next batch when rows wait."""
        self.batches += 1
        for n, writer in enumerate(writers):
            writer.settled(out if isinstance(out, BaseException) else out[n], ops[n].open)
        if self._dirty and not self._writing:
            self.wake(next(iter(self._dirty)), soon=True)


async def _thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


class ChunkWriter:
    """One attempt's rows, written in order through its store's ``Batcher``.

    ``add`` (sync, never blocks) queues a piece; ``end``/``fail`` queue the attempt's last
    row and wait until it is written.  A store failure is logged and ends the writing
    (the call goes on: the history will hold the reply); ``attempt`` is 0 until opened.
    """

    def __init__(self, to: StreamTarget, *, json: bool = False) -> None:
        self.to, self.json = to, json
        self.batcher: Batcher = to.batcher if to.batcher is not None else Batcher(to.store)
        self.attempt = 0
        self.chars = 0  # characters queued so far: the next chunk's offset
        self._pieces: list[str] = []  # text waiting (it starts at chars - _waiting)
        self._waiting = 0  # characters in _pieces
        self._last: StreamRow | None = None  # the attempt's end or error row, waiting
        self._opening = False
        self._closed = False
        self._broken = False
        self._drained: asyncio.Future[None] | None = None

    def add(self, piece: str) -> None:
        """Queue ``piece`` (its offset is the characters queued before it)."""
        if self._broken or not piece:
            return
        first = not self._pieces
        self._pieces.append(piece)
        self.chars += len(piece)
        self._waiting += len(piece)
        if first or self._waiting >= FLUSH_CHARS:  # (already woken for the others)
            self._ready(self._waiting >= FLUSH_CHARS)

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
        row when the next batch goes, without waiting."""
        if not self._broken:
            self._last = StreamRow(self.to.instance_id, self.to.seq, 0, "error",
                                   info={"error": "cancelled"})
            self._closed = True
            self._ready(True)

    async def _close(self, last: StreamRow) -> None:
        if self._broken:
            return
        self._last = last
        self._closed = True
        self._drained = asyncio.get_running_loop().create_future()
        self._ready(True)
        with contextlib.suppress(Exception):
            await asyncio.shield(self._drained)

    def _ready(self, soon: bool) -> None:
        if not self._opening:  # rows written while the attempt opens wait for its number
            self.batcher.wake(self, soon=soon)

    def take(self) -> StreamOp:
        """The op writing the rows waiting (the batcher's): the first opens the attempt."""
        rows = _chunks(self.to, self._pieces, self.chars - self._waiting)
        if self._last is not None:
            rows.append(self._last)
        self._pieces, self._waiting, self._last = [], 0, None
        to = self.to
        if not self.attempt:
            self._opening = True
            return StreamOp(to.instance_id, tuple(_numbered(r, 0) for r in rows), True, to.seq,
                            to.since, {"json": True} if self.json else {}, time.time())
        return StreamOp(to.instance_id, tuple(_numbered(r, self.attempt) for r in rows))

    def settled(self, result: int | BaseException, opened: bool) -> None:
        """The batcher wrote (or failed to write) this writer's op."""
        if isinstance(result, BaseException):
            self._broken, self._pieces, self._last = True, [], None
            log.warning("stream of %s step %d: %s", self.to.instance_id, self.to.seq, result)
        elif opened:
            self.attempt, self._opening = result, False
            _maybe_prune(self.to)
        if (self._pieces or self._last is not None) and not self._broken:
            self.batcher.wake(self, soon=self._closed)
        elif self._drained is not None and not self._drained.done():
            self._drained.set_result(None)


def _chunks(to: StreamTarget, pieces: list[str], offset: int) -> list[StreamRow]:
    """``pieces`` (text starting at character ``offset`` of the reply) as chunk rows of at
    most ``ROW_CHARS`` characters, pieces joined in order (a longer piece stays whole)."""
    rows: list[StreamRow] = []
    run: list[str] = []
    size = 0
    for piece in pieces:
        if run and size + len(piece) > ROW_CHARS:
            rows.append(StreamRow(to.instance_id, to.seq, 0, "chunk", "".join(run), offset))
            offset, run, size = offset + size, [], 0
        run.append(piece)
        size += len(piece)
    if run:
        rows.append(StreamRow(to.instance_id, to.seq, 0, "chunk", "".join(run), offset))
    return rows


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
            await _thread(to.store.stream_prune, now - to.retention_s)
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
        """Run the stream to its end without looking at the pieces (they are still written
        for subscribers); its ``Completion``.  Awaited in the caller's task: no task or queue
        of its own."""
        writer = self._writer()
        try:
            out, streamed = await self._send(writer.add if writer is not None else _drop)
        except BaseException as exc:
            await _failed(writer, exc)
            raise
        return await self._ended(writer, out, streamed)

    async def _ended(self, writer: ChunkWriter | None, out: Completion, streamed: bool
                     ) -> Completion:
        """After the call: a reply answered from the store written as one piece, the
        attempt's end written and waited for, ``completion`` set."""
        if writer is not None:
            if not streamed:
                writer.add(out.text)
            await writer.end(out)
        self.completion = out
        return out

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
            yield out.text
        await self._ended(writer, out, streamed)


def _drop(piece: str) -> None:
    """A sink that keeps nothing (a step with no stream target)."""


async def _failed(writer: ChunkWriter | None, exc: BaseException) -> None:
    """Close ``writer`` after the call raised ``exc`` (cancelled: in the background)."""
    if writer is None:
        return
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        writer.abandon()
    else:
        await writer.fail(exc)
