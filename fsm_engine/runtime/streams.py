"""The write side of streaming: a step's streamed model call, its pieces made durable.

``runtime.stream_reply.ReplyStream`` is what ``step.llm.stream(...)`` returns; beside its
call a ``ChunkWriter`` queues the pieces for the store's stream log (``store.streams``), and the
engine's ``Batcher`` writes the rows of every attempt streaming in the process together:
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
ended): the next attempt supersedes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..store.streams import FENCED, ROW_CHARS, StreamOp, StreamRow
from . import stream_inline

if TYPE_CHECKING:

    from ..llm.base import Completion
    from ..store.base import Store
    from ..store.records import InstanceRecord, StepCommit

__all__ = ["StreamTarget", "Streams", "Batcher", "ChunkWriter", "FLUSH_S", "FLUSH_CHARS",
           "RETENTION_S"]

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

    async def tail(self, instance_id: str, step: StepCommit | None = None
                   ) -> tuple[StreamOp, ...]:
        """What ``step`` of ``instance_id``, about to commit, carries of its streamed calls
        (``StepCommit.stream``: the rows still waiting, ``Batcher.tail``), after any write
        of theirs in flight; ``()``: nothing (or all left to its history's ``llm_calls``,
        ``stream_inline``)."""
        calls = [e for h in step.history for e in h.detail.get("llm_calls", ())] \
            if step is not None and step.history else None
        while True:
            got = self.batcher.tail(instance_id, calls)
            if isinstance(got, tuple):
                return got
            await got


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

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The running loop (a new one: what waited for the old is dropped)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._dirty, self._timer, self._writing = loop, {}, None, False
            self.held = {}
        return loop

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
        loop = self._bind()
        if not writer.queued:
            writer.queued = True
            self._dirty[writer] = None
            if not writer.held:
                writer.held = True
                self.held.setdefault(writer.to.instance_id, []).append(writer)
        if self._writing:
            return
        due = self._last + FLUSH_S if soon else max(self._last + FLUSH_S, loop.time() + FLUSH_S)
        if self._timer is not None and (not soon or self._timer.when() <= due):
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
        batch meanwhile: ask again).  ``calls``: the step's ``llm_calls`` entries; when
        every writer's rows can be left to them (``ChunkWriter.inlinable``), they are
        (``stream_inline``) and ``()`` is returned."""
        self._bind()  # (first: a new loop drops the old one's writers)
        writers = self.held.get(instance_id)
        if not writers:
            return ()
        wait = self._wait(writers)
        if wait is not None:
            return wait
        if calls and all(w.inlinable(calls) for w in writers):
            for w in writers:
                self._drop(w)
                w.inline()
            del self.held[instance_id]
            return ()
        ops, left = [], []
        for w in writers:
            if not w.closed:
                left.append(w)
                continue
            self._drop(w)  # (its batch has nothing left to take)
            op = w.take()
            if op is not None:
                ops.append(op)
        if left:
            self.held[instance_id] = left
        else:
            del self.held[instance_id]
        if ops and ops[0].open:
            _maybe_prune(writers[0].to)
        return tuple(ops)

    def _drop(self, writer: ChunkWriter) -> None:
        """``writer`` off the next batch (its step's commit takes what waits)."""
        if writer.queued:
            del self._dirty[writer]
            writer.queued = False

    def _wait(self, writers: list[ChunkWriter]) -> asyncio.Future[None] | None:
        """What to wait for before the ended ``writers``' rows can go with a commit (None:
        nothing): a write of theirs in flight, or odd text waiting (written by a batch,
        started now).  A writer still open (a call the action left running) is not waited
        for: its rows go by the batches."""
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
        writers, self._dirty = sorted(self._dirty, key=_began), {}
        for w in writers:
            w.queued = False
        taken = [(w, op) for w in writers if (op := w.take(fenced=True)) is not None]
        if not taken:  # (their step's commit took them)
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


def _began(writer: ChunkWriter) -> int:
    return writer.serial


async def _thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def _odd(piece: str) -> bool:
    """True for text a step's commit does not carry: a NUL (PostgreSQL refuses it) or
    characters UTF-8 cannot encode (lone surrogates)."""
    if "\x00" in piece:
        return True
    if piece.isascii():
        return False
    try:
        piece.encode()
    except UnicodeEncodeError:
        return True
    return False


class ChunkWriter:
    """One attempt's rows, written in order through its store's ``Batcher``.

    ``add`` (sync, never blocks) queues a piece; ``end``/``fail``/``abandon`` queue the
    attempt's last row (sync too).  What is still waiting when the step commits goes with
    the commit (``Batcher.tail``), so it is in the store no later than the step.  A store
    failure is logged and ends the writing (the call goes on: the history will hold the
    reply) until the reply is complete: then, once, the whole reply is written again as a
    new attempt (superseding the one the failure left open, whatever of it was written),
    so a database restart mid-stream still leaves the step's reply streamed to its end;
    ``attempt`` is 0 until a batch opened it.
    """

    def __init__(self, to: StreamTarget, *, json: bool = False) -> None:
        self.to, self.json = to, json
        self.batcher: Batcher = to.batcher if to.batcher is not None else Batcher(to.store)
        self.serial = next(_serials)  # writers' rows are written in the order they began
        self.attempt = 0
        self.chars = 0  # characters queued so far: the next chunk's offset
        self._pieces: list[str] = []  # text waiting (it starts at chars - _waiting)
        self._waiting = 0  # characters in _pieces
        self._last: tuple[str, dict[str, Any], float] | None = None  # end/error row waiting
        self.busy = False  # an op of it is being written
        self.closed = False
        self.odd = False  # a piece waits that a commit does not carry (``_odd``)
        self.queued = False  # in the batcher's next batch
        self.held = False  # on the batcher's ``held`` list
        self._broken = False
        self._end: tuple[str, str] | None = None  # the complete reply and its finish reason
        self._retried = False  # written again as a new attempt after a failure
        self._settle: asyncio.Future[None] | None = None
        self.entry: dict[str, Any] | None = None  # the call's ``llm_calls`` entry, once ended

    @property
    def waiting(self) -> bool:
        """Rows wait to be written."""
        return bool(self._pieces) or self._last is not None

    def add(self, piece: str) -> None:
        """Queue ``piece`` (its offset is the characters queued before it)."""
        if self._broken or not piece:
            return
        first = not self._pieces
        self._pieces.append(piece)
        self.chars += len(piece)
        self._waiting += len(piece)
        if not self.odd and ("\x00" in piece or not piece.isascii()):
            self.odd = _odd(piece)
        if first or self._waiting >= FLUSH_CHARS:  # (already woken for the others)
            self._ready(self._waiting >= FLUSH_CHARS)

    def end(self, out: Completion, entry: dict[str, Any] | None = None) -> None:
        """The reply is complete: its ``end`` row waits with what is left (after a failed
        write, with the whole reply as a new attempt).  ``entry``: the call's ``llm_calls``
        entry (``stream_inline``: it may stand for the rows)."""
        self.entry = entry
        self._end = (out.text, out.finish_reason)
        if self._broken and not self._retried:
            self._anew()
        self._close("end", {"finish": out.finish_reason, "chars": self.chars})

    def inlinable(self, calls: list[dict[str, Any]]) -> bool:
        """True when the step's history can hold this attempt's rows (``stream_inline``):
        none written, ended cleanly, superseding nothing of an earlier step, and its entry
        (in ``calls``, the step's ``llm_calls``) holding exactly the text queued; not
        after a failed write (the new attempt must supersede what that left open)."""
        entry = self.entry
        return (entry is not None and not self.attempt and not self.busy and not self._retried
                and self._last is not None and self._last[0] == "end"
                and self.to.since == self.to.seq and any(e is entry for e in calls)
                and "".join(self._pieces) == entry.get("reply"))

    def inline(self) -> None:
        """Leave this attempt's rows to its entry (``inlinable``): marked, nothing waits."""
        assert self.entry is not None
        stream_inline.mark(self.entry, self.json)
        self._pieces, self._waiting, self._last = [], 0, None

    def fail(self, exc: BaseException) -> None:
        """The call failed: an ``error`` row naming the error class waits with what is left."""
        self._close("error", {"error": type(exc).__name__})

    def abandon(self) -> None:
        """The step was cancelled (e.g. its timeout): what is left and an ``error`` row go
        with the next batch (its commit may never come)."""
        self._close("error", {"error": "cancelled"}, soon=True)

    def _close(self, kind: str, info: dict[str, Any], soon: bool = False) -> None:
        if self._broken or self.closed:
            return
        self._last = (kind, info, time.time())
        self.closed = True
        self._ready(soon)

    def _anew(self) -> None:
        """After a failed write: the complete reply waits as a new attempt's rows (once)."""
        assert self._end is not None
        text = self._end[0]
        self._retried, self._broken, self.attempt = True, False, 0
        self._pieces = [text[n:n + ROW_CHARS] for n in range(0, len(text), ROW_CHARS)]
        self.chars = self._waiting = len(text)
        self.odd = _odd(text)
        self.held = self in self.batcher.held.get(self.to.instance_id, ())

    def _ready(self, soon: bool) -> None:
        # (rows queued while a write is in flight wait for it to settle)
        if not self.busy and (soon or not self.queued):
            self.batcher.wake(self, soon=soon)

    def settling(self) -> asyncio.Future[None]:
        """Done when this writer's write in flight (or the next one) settles."""
        if self._settle is None:
            self._settle = asyncio.get_running_loop().create_future()
        return self._settle

    def take(self, *, fenced: bool = False) -> StreamOp | None:
        """The op writing the rows waiting (None: none); the first opens the attempt.
        ``fenced`` (a batch's): it writes only while the instance is the step's owner's."""
        if not self._pieces and self._last is None:
            return None
        to, attempt, now = self.to, self.attempt, time.time()
        rows = _chunks(to, self._pieces, self.chars - self._waiting, attempt, now)
        if self._last is not None:
            kind, info, at = self._last
            rows.append(StreamRow(to.instance_id, to.seq, attempt, kind, info=info, at=at))
        self._pieces, self._waiting, self._last, self.odd = [], 0, None, False
        owner = to.owner if fenced else None
        if not attempt:
            return StreamOp(to.instance_id, tuple(rows), True, to.seq, to.since,
                            {"json": True} if self.json else {}, now, owner)
        return StreamOp(to.instance_id, tuple(rows), owner=owner)

    def _fenced(self) -> None:
        """The instance is no longer the step's owner's (taken over): nothing more of this
        attempt is written (its new owner's attempt supersedes it)."""
        self._broken = self._retried = True
        self._pieces, self._last = [], None
        log.info("stream of %s step %d: the instance was taken over; its rows stop here",
                 self.to.instance_id, self.to.seq)

    def settled(self, result: int | BaseException, opened: bool) -> None:
        """The batcher wrote (or failed to write) this writer's op."""
        self.busy = False
        if result == FENCED:
            self._fenced()
        elif isinstance(result, BaseException):
            self._broken, self._pieces, self._last = True, [], None
            log.warning("stream of %s step %d: %s", self.to.instance_id, self.to.seq, result)
            if self.closed and self._end is not None and not self._retried:
                self._anew()  # (its end row was in the failed write)
                self._last = ("end", {"finish": self._end[1], "chars": self.chars}, time.time())
        elif opened:
            self.attempt = result
            _maybe_prune(self.to)
        if self.waiting and not self._broken:
            self.batcher.wake(self, soon=self.closed)
        elif self.closed or self._broken:
            self.batcher.release(self)
        if self._settle is not None:
            if not self._settle.done():
                self._settle.set_result(None)
            self._settle = None


_serials = itertools.count()


def _chunks(to: StreamTarget, pieces: list[str], offset: int, attempt: int,
            at: float) -> list[StreamRow]:
    """``pieces`` (text starting at character ``offset`` of the reply) as chunk rows of
    ``attempt`` written ``at``, of at most ``ROW_CHARS`` characters, pieces joined in order
    (a longer piece stays whole)."""
    if not pieces:
        return []
    if sum(map(len, pieces)) <= ROW_CHARS:  # (the usual case: one row)
        return [StreamRow(to.instance_id, to.seq, attempt, "chunk", "".join(pieces), offset,
                          {}, at)]
    rows: list[StreamRow] = []
    run: list[str] = []
    size = 0
    for piece in pieces:
        if run and size + len(piece) > ROW_CHARS:
            rows.append(StreamRow(to.instance_id, to.seq, attempt, "chunk", "".join(run),
                                  offset, {}, at))
            offset, run, size = offset + size, [], 0
        run.append(piece)
        size += len(piece)
    if run:
        rows.append(StreamRow(to.instance_id, to.seq, attempt, "chunk", "".join(run), offset,
                              {}, at))
    return rows


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
