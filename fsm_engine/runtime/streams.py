"""The write side of streaming: a step's streamed model call, its pieces made durable.

``runtime.stream_reply.ReplyStream`` is what ``step.llm.stream(...)`` returns; beside its
call a ``stream_writer.ChunkWriter`` queues the pieces for the store's stream log
(``store.streams``), and the engine's ``Batcher`` writes the rows of every attempt
streaming in the process together:
the first batch ``FLUSH_S`` seconds after a row waits, then at most one per ``FLUSH_S``
(sooner past ``FLUSH_CHARS`` waiting), so a reader sees a piece within about ``FLUSH_S``
plus one write and a fast model costs at most one transaction per ``FLUSH_S`` however many
instances stream.  These writes are appends, not steps (``ledger.py`` stays the only writer
of steps).  What still waits when the step commits goes in the step's own transaction
(``StepCommit.stream``, taken by ``Driver.commit``), so an attempt's rows are in the store
no later than its step; and when that is all of every attempt of the step — calls that
ended cleanly within ``FLUSH_S`` — not even that: the step's history holds them
(``stream_inline``), so a short call nobody watches costs no write, task or future of its
own.  A crash before the commit leaves the attempt as far as the batches wrote it (not
ended): the next attempt supersedes it.  A writer whose provider has ended waits for its
call to end (the circuit breaker records the outcome on a later turn of the event loop)
rather than have a batch write it in that turn, and a call that ended with nothing of it
written is left to its step's commit by the first batch that finds it so (``_due``):
written by the next one if the action is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from ..store.streams import StreamOp

if TYPE_CHECKING:
    from ..store.base import Store
    from ..store.records import InstanceRecord, StepCommit
    from .stream_writer import ChunkWriter

__all__ = ["StreamTarget", "Streams", "Batcher", "FLUSH_S", "FLUSH_CHARS", "RETENTION_S",
           "maybe_prune"]

log = logging.getLogger("fsm_engine")

#: Longest a piece waits for the next write while one is in flight (seconds).
FLUSH_S = 0.02
#: Characters waiting that start a write at once.
FLUSH_CHARS = 2048
#: Default retention of a committed step's stream rows (seconds; the history keeps the reply).
RETENTION_S = 3600.0
#: Least time between two prunes from one process (seconds).
PRUNE_EVERY_S = 60.0
_pruned_at = 0.0


class StreamTarget(NamedTuple):
    """Where a step's streamed calls go: ``store``, the instance, the step ``seq`` (the
    history row the step will write), ``since`` (the first seq whose open attempts a new
    attempt supersedes: earlier seqs lost to crashes, see ``target``), and how long rows
    of a committed step are kept (``retention_s``, seconds), the ``batcher`` its rows
    go through (None: one of its own), and the ``owner`` the step began under (a batch
    writes its rows only while the instance is still that owner's: ``StreamOp.owner``).
    A ``NamedTuple``: one is built per step."""

    store: Any
    instance_id: str
    seq: int
    since: int
    retention_s: float = RETENTION_S
    batcher: Batcher | None = None
    owner: str | None = None


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
        return StreamTarget(self.store, rec.id, seq, seq - back, self.retention_s, self.batcher,
                            rec.owner)

    def tail(self, instance_id: str, step: StepCommit | None = None
             ) -> tuple[StreamOp, ...] | Coroutine[Any, Any, tuple[StreamOp, ...]]:
        """What ``step`` of ``instance_id``, about to commit, carries of its streamed calls
        (``StepCommit.stream``: the rows still waiting, ``Batcher.tail``); ``()``: nothing
        (or all left to its history's ``llm_calls``, ``stream_inline``).  While a write of
        theirs is in flight, a coroutine giving that once it settled (awaited by the
        caller: the usual short call costs no coroutine)."""
        history = step.history if step is not None else ()
        calls: list[dict[str, Any]] | None = None
        if len(history) == 1:  # (the usual step: one row, no list built)
            calls = history[0].detail.get("llm_calls") or []
        elif history:
            calls = [e for h in history for e in h.detail.get("llm_calls", ())]
        got = self.batcher.tail(instance_id, calls)
        return got if isinstance(got, tuple) else self._settled(instance_id, calls, got)

    async def _settled(self, instance_id: str, calls: list[dict[str, Any]] | None,
                       wait: asyncio.Future[None]) -> tuple[StreamOp, ...]:
        while True:
            await wait
            got = self.batcher.tail(instance_id, calls)
            if isinstance(got, tuple):
                return got
            wait = got


class Batcher:
    """The stream writes of one store, batched across every attempt streaming in this process
    (a group commit for stream rows): one ``Store.stream_write`` transaction carries every
    writer's pending rows, in the order the writers began.  A batch starts ``FLUSH_S``
    after the first row waits (sooner once ``FLUSH_CHARS`` wait) and at most every
    ``FLUSH_S``; one is in flight at a time.  A writer's rows still waiting when its step
    commits go with the commit instead (``tail``): a call that ends within ``FLUSH_S``
    costs no write of its own.  On a local store (SQLite) a batch is written on the event
    loop, as the group committer does: measured, a thread hop per write and the
    connection's lock cost more than the write; on a remote one (PostgreSQL) in a thread.
    Bound to the running event loop (rebuilt for another)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.offload = bool(getattr(store, "remote", False))
        self._dirty: dict[ChunkWriter, None] = {}  # writers with rows waiting
        #: Writers not done yet (rows waiting, or a write in flight, or still open), by
        #: instance, in the order they began: what the instance's next commit takes.
        self.held: dict[str, list[ChunkWriter]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writing = False
        self._last = 0.0  # loop time the last batch began
        self.batches = 0

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the running ``loop``, a new one: what waited for the old is dropped
        (called where ``self._loop is not loop``)."""
        self._loop, self._dirty, self._timer, self._writing = loop, {}, None, False
        self.held = {}

    def release(self, writer: ChunkWriter) -> None:
        """``writer`` is done (all written, or broken): off its instance's list."""
        writers = self.held.get(writer.to.instance_id)
        if writers is not None and writer in writers:
            writers.remove(writer)
            if not writers:
                del self.held[writer.to.instance_id]

    def wake(self, writer: ChunkWriter, *, soon: bool = False) -> None:
        """``writer`` has rows waiting (``soon``: many, or its last one); at its first, its
        instance's next commit will look at it (``held``)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._bind(loop)
        if not writer.queued:
            writer.queued = True
            self._dirty[writer] = None
            if not writer.held:
                writer.held = True
                self.held.setdefault(writer.to.instance_id, []).append(writer)
        if self._writing or (self._timer is not None and not soon):  # (a batch is due)
            return
        due = self._last + FLUSH_S if soon else max(self._last + FLUSH_S, loop.time() + FLUSH_S)
        if self._timer is not None and self._timer.when() <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(max(loop.time(), due), self._start)

    def tail(self, instance_id: str, calls: list[dict[str, Any]] | None = None
             ) -> tuple[StreamOp, ...] | asyncio.Future[None]:
        """The rows of ``instance_id``'s writers still waiting, as ops for its step's commit
        (``StepCommit.stream``; ``()``: none), those of the writers that ended, then done;
        or, while one of those has a write in flight or holds text a commit does not carry
        (a NUL, text that is not UTF-8), a future to wait for (its rows are written by a
        batch meanwhile: ask again).  A writer still open, its reader gone (an action that
        left its ``async for`` early, or its call running), is ended first
        (``ChunkWriter.leave``): the step is over.  ``calls``: the step's ``llm_calls`` entries; when
        every writer's rows can be left to them (``ChunkWriter.inlinable``), they are
        (``stream_inline``) and ``()`` is returned."""
        if self._loop is not (loop := asyncio.get_running_loop()):  # (first: a new loop
            self._bind(loop)                                         # drops the old one's)
        writers = self.held.get(instance_id)
        if not writers:
            return ()
        for w in writers:  # (the step is over: an attempt its reader left ends with it)
            if not w.closed:
                w.leave()
        if calls:
            for w in writers:
                if not w.inlinable(calls):
                    break
            else:  # each one's rows left to its entry
                for w in writers:
                    w.inline()
                del self.held[instance_id]
                return ()
        wait = self._wait(writers)
        return wait if wait is not None else self._take(instance_id, writers)

    def _take(self, instance_id: str, writers: list[ChunkWriter]) -> tuple[StreamOp, ...]:
        """The ops of the ended ``writers`` of ``instance_id`` (those still open, their writes
        broken, stay held until those settle)."""
        ops, left = [], []
        for w in writers:
            if not w.closed:
                left.append(w)
                continue
            self.drop(w)  # (its batch has nothing left to take)
            op = w.take()
            if op is not None:
                ops.append(op)
        if left:
            self.held[instance_id] = left
        else:
            del self.held[instance_id]
        if ops and ops[0].open:
            maybe_prune(writers[0].to)
        return tuple(ops)

    def drop(self, writer: ChunkWriter) -> None:
        """``writer`` off the next batch (its step's commit takes, or its history holds,
        what waits)."""
        if writer.queued:
            del self._dirty[writer]
            writer.queued = False

    def _wait(self, writers: list[ChunkWriter]) -> asyncio.Future[None] | None:
        """What to wait for before the ended ``writers``' rows can go with a commit (None:
        nothing): a write of theirs in flight, or odd text waiting (written by a batch,
        started now).  (A writer still open is one whose writes broke: nothing to wait
        for.)"""
        for w in writers:
            if w.closed and (w.busy or (w.odd and w.waiting)):
                if not w.busy:
                    self.wake(w, soon=True)
                return w.settling()
        return None

    def _start(self) -> None:
        self._timer = None
        if not self._dirty or self._writing:
            return
        assert self._loop is not None
        self._last = self._loop.time()
        writers, self._dirty = _due(sorted(self._dirty, key=_began))
        for w in writers:
            w.queued = False
        taken = [(w, op) for w in writers if (op := w.take(fenced=True)) is not None]
        if not taken:  # (their step's commit took them, or they are ending)
            if self._dirty:
                self._timer = self._loop.call_at(self._last + FLUSH_S, self._start)
            return
        for w, _ in taken:
            w.busy = True
        if not self.offload:
            self._done(taken, self._apply([op for _, op in taken]))
            return
        self._writing = True
        self._loop.create_task(self._offloaded(taken))

    async def _offloaded(self, taken: list[tuple[ChunkWriter, StreamOp]]) -> None:
        try:
            self._done(taken, await _thread(self._apply, [op for _, op in taken]))
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

    def _done(self, taken: list[tuple[ChunkWriter, StreamOp]],
              out: list[int] | BaseException) -> None:
        """Tell each writer what its op gave; start the next batch when rows wait."""
        self.batches += 1
        for n, (writer, op) in enumerate(taken):
            writer.settled(out if isinstance(out, BaseException) else out[n], op.open)
        if self._dirty and not self._writing:
            self.wake(next(iter(self._dirty)), soon=True)


def _due(writers: list[ChunkWriter]) -> tuple[list[ChunkWriter], dict[ChunkWriter, None]]:
    """``writers`` (in the order they began) split into those a batch writes now and those
    it leaves waiting: a writer whose provider has ended but whose call has not (its end
    row comes once the call's layers above the provider return, its step's commit at once
    after: ``ChunkWriter.finishing``), one whose call ended with nothing of it written yet,
    the first batch that finds it so (``_spare``), and any later writer of the same
    instance (so attempts keep the order they began in)."""
    now: list[ChunkWriter] = []
    kept: dict[ChunkWriter, None] = {}
    ending: set[str] = set()
    for w in writers:
        if (w.finishing and not w.closed) or w.to.instance_id in ending or _spare(w):
            ending.add(w.to.instance_id)
            kept[w] = None
        else:
            now.append(w)
    return now, kept


def _spare(writer: ChunkWriter) -> bool:
    """True the first time a batch finds ``writer``'s call ended cleanly or not (its last row
    queued) with nothing of it written yet: its step's commit, which follows the action's
    return, carries its rows or leaves them to its history (``stream_inline``), so a short
    call costs no write of its own even when the event loop is busy past ``FLUSH_S`` between
    its end and its commit (measured on a PostgreSQL worker: a quarter of the calls were
    written by a batch first); the next batch writes them if the commit has not come yet
    (an action still running after its call).  Not for text a commit cannot carry
    (``ChunkWriter.odd``): its commit waits for that write."""
    if writer.closed and not writer.attempt and not writer.busy and not writer.odd \
            and not writer.spared:
        writer.spared = True
        return True
    return False


def _began(writer: ChunkWriter) -> int:
    return writer.serial


async def _thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def maybe_prune(to: StreamTarget) -> None:
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
