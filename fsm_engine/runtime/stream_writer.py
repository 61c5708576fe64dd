"""One streamed call's rows on their way to the store's stream log: ``ChunkWriter``.

Beside each streamed call (``runtime.stream_reply.ReplyStream``) a writer queues the
reply's pieces and its last row (``end`` or ``error``) for the engine's ``Batcher``
(``runtime.streams``), which writes the rows of every attempt streaming in the process
together; what still waits when the step commits goes with the commit, or, for a call
that ended cleanly before its first batch, is left to the step's history
(``stream_inline``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..store.streams import FENCED, ROW_CHARS, StreamOp, StreamRow
from . import stream_inline, streams
from .streams import Batcher, maybe_prune

if TYPE_CHECKING:
    from ..llm.base import Completion
    from .streams import StreamTarget

__all__ = ["ChunkWriter", "next_serial"]

log = logging.getLogger("fsm_engine")


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

    __slots__ = ("to", "json", "batcher", "serial", "attempt", "chars", "_pieces", "_waiting",
                 "_last", "busy", "closed", "odd", "queued", "held", "_broken", "_end",
                 "_retried", "_settle", "entry", "finishing", "spared", "ending")

    def __init__(self, to: StreamTarget, *, json: bool = False, serial: int | None = None) -> None:
        self.to, self.json = to, json
        self.batcher: Batcher = to.batcher if to.batcher is not None else Batcher(to.store)
        #: writers' rows are written in the order their calls began (``next_serial``)
        self.serial = next(_serials) if serial is None else serial
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
        self.finishing = False  # the provider's stream ended; the call has not yet
        self.spared = False  # a batch left its ended call's rows to its step's commit once
        #: Ends this writer from what its call gave, when it has ended though its reader
        #: did not take the end (``leave``); None: nothing to end it from.
        self.ending: Callable[[], None] | None = None

    @property
    def waiting(self) -> bool:
        """Rows wait to be written."""
        return bool(self._pieces) or self._last is not None

    def add(self, piece: str | list[str]) -> None:
        """Queue ``piece`` (its offset is the characters queued before it; a ``list``: the
        pieces that arrived together, in order); nothing once the attempt is closed."""
        if self._broken or self.closed or not piece:
            return
        first = not self._pieces
        if isinstance(piece, str):
            self._pieces.append(piece)
        else:  # (kept apart, empty ones left out: rows are cut at pieces, ``_chunks``)
            self._pieces += [p for p in piece if p]
            if not (piece := "".join(piece)):
                return
        size = len(piece)
        self.chars += size
        self._waiting += size
        if not self.odd and ("\x00" in piece or not piece.isascii()):
            self.odd = _odd(piece)
        if self._waiting >= streams.FLUSH_CHARS:  # (read here: set once, in ``streams``)
            if not self.busy:  # (rows queued while a write is in flight wait for it)
                self.batcher.wake(self, soon=True)
        elif first and not self.busy and not self.queued:  # (a wake, inline: each call's
            self.batcher.wake(self)                         # first piece; then woken already)

    def provider_done(self) -> None:
        """The provider's stream has ended: the reply is complete, and its ``end`` row comes
        as soon as the call's layers above the provider return (a circuit breaker's or rate
        limit's bookkeeping may take a turn of the event loop first).  Meanwhile batches
        leave this writer's rows waiting (``streams._due``), so the step's commit, which
        follows at once, carries them or its history holds them."""
        self.finishing = True

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
        entry, last = self.entry, self._last
        if entry is None or self.attempt or self.busy or self._retried or self.odd \
                or last is None or last[0] != "end" or self.to.since != self.to.seq:
            return False
        for e in calls:  # (by identity: the history holds this very entry)
            if e is entry:
                pieces = self._pieces
                return (pieces[0] if len(pieces) == 1 else "".join(pieces)) == entry.get("reply")
        return False

    def inline(self) -> None:
        """Leave this attempt's rows to its entry (``inlinable``): marked, off the next
        batch, nothing waits."""
        assert self.entry is not None
        stream_inline.mark(self.entry, self.json)
        self._pieces, self._waiting, self._last = [], 0, None
        if self.queued:
            self.batcher.drop(self)

    def fail(self, exc: BaseException) -> None:
        """The call failed: an ``error`` row naming the error class waits with what is left."""
        self._close("error", {"error": type(exc).__name__})

    def abandon(self) -> None:
        """The step was cancelled (e.g. its timeout): what is left and an ``error`` row go
        with the next batch (its commit may never come)."""
        self._close("error", {"error": "cancelled"}, soon=True)

    def leave(self) -> None:
        """Its step commits with this attempt still open: the reader left early (an
        action's ``break`` out of ``async for``: its generator is closed on a later turn
        of the event loop, a short process never runs it) or left the call running.  The
        attempt ends now, so the commit carries (or its history holds) its last row:
        ``end`` when the call had ended with its reply (``ending``), ``error`` the call's
        error when it failed, else ``error`` ``cancelled``; later pieces are not written."""
        if self.closed or self._broken:
            return
        if self.ending is not None:
            self.ending()
        if not self.closed:
            self._close("error", {"error": "cancelled"})

    def _close(self, kind: str, info: dict[str, Any], soon: bool = False) -> None:
        if self._broken or self.closed:
            return
        self._last = (kind, info, time.time())
        self.closed = True
        if not self.busy and (soon or not self.queued):  # (else: the write in flight, or the
            self.batcher.wake(self, soon=soon)          # batch it is queued for, takes it)

    def _anew(self) -> None:
        """After a failed write: the complete reply waits as a new attempt's rows (once)."""
        assert self._end is not None
        text = self._end[0]
        self._retried, self._broken, self.attempt = True, False, 0
        self._pieces = [text[n:n + ROW_CHARS] for n in range(0, len(text), ROW_CHARS)]
        self.chars = self._waiting = len(text)
        self.odd = _odd(text)
        self.held = self in self.batcher.held.get(self.to.instance_id, ())

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
            maybe_prune(self.to)
        if self.waiting and not self._broken:
            self.batcher.wake(self, soon=self.closed)
        elif self.closed or self._broken:
            self.batcher.release(self)
        if self._settle is not None:
            if not self._settle.done():
                self._settle.set_result(None)
            self._settle = None


_serials = itertools.count(1)


def next_serial() -> int:
    """The place of a call beginning now among this process's streamed calls (ascending): a
    writer opened later for it (``ChunkWriter(serial=…)``) is still written in that order."""
    return next(_serials)


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
