"""Group commit: steps of many instances that finish together share one transaction.

Each ``submit`` queues a ``StepCommit`` and waits.  The first submission in
an event-loop iteration schedules a flush with ``call_soon``, so everything
submitted before the loop comes round again is written by one
``Ledger.write`` (one ``Store.commit`` call: one ``BEGIN … COMMIT``, one
fsync), each step still all-or-nothing (the store applies a step only when its version matches).
This is the classic group commit of database logs (Gawlick & Kinkade, 1985;
PostgreSQL's ``commit_delay``), without a delay: batching comes from
concurrency alone, so a lone instance pays no extra latency; when the engine
runs a single instance (``solo``) the commit is made inline, without a
future or a trip round the event loop.

The batch is written on the event loop's thread.  Handing it to a writer
thread (so SQLite's work would overlap the loop's) was measured slower: every
``execute`` releases and retakes the GIL, and while the loop runs Python the
writer waits up to the interpreter's switch interval to get it back (the GIL
"convoy"), so 10,000 instances went from ~6 s to ~7.5 s.

A store whose calls wait on a network (``Store.remote``: PostgreSQL) is the
opposite case: a batch spends most of its time waiting for the server, so it
is written by a thread while the loop goes on (the GIL is free while the
socket waits); a lone instance (``solo``) still commits inline, having nothing
to overlap with.  One batch is in flight at a time; steps submitted meanwhile
form the next batch, written as soon as the first returns, so batches grow
with the load instead of the loop stalling on each round trip (measured with
``bench/scale_out.py``: see ``bench/RESULTS.md``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ..errors import StepRejected, StoreError
from ..store.base import Store
from ..store.records import StepCommit
from .ledger import Ledger

A = TypeVar("A")
R = TypeVar("R")


class GroupCommitter:
    """Batches ``StepCommit``s from concurrent steps into single transactions.

    A batch is written at the end of the event-loop iteration, or as soon as
    ``max_batch`` steps are waiting (default 500: large enough to amortise the
    fsync, small enough that the first steps of a 10,000-instance resume are
    durable within a fraction of a second).
    """

    def __init__(self, store: Store | Ledger, max_batch: int = 500,
                 solo: Callable[[], bool] = lambda: False) -> None:
        #: The one writer (``runtime.ledger``); a plain ``Store`` gets a ledger of its own.
        self.ledger = store if isinstance(store, Ledger) else Ledger(store)
        self.store = self.ledger.store
        self.max_batch = max_batch
        self.solo = solo
        #: Batches go to a thread, one at a time (the store waits on a network).
        self.offload = bool(getattr(self.store, "remote", False))
        self._pending: list[tuple[StepCommit, asyncio.Future[bool]]] = []
        self._scheduled = False
        self._writing = False  # a batch is in flight in the writer thread (offload)
        self.batches = 0
        self.steps = 0

    async def submit(self, step: StepCommit) -> bool:
        """Queue ``step``; return True once durably committed, False when stale.

        A step the store refuses (``StepRejected``: a value it cannot encode,
        a constraint) raises for that step alone; the rest of its batch is
        committed without it.  Any other store error (disk full, I/O error,
        database gone) reaches every step of the failed batch.
        """
        done = self.enqueue(step)
        return await done if isinstance(done, asyncio.Future) else done

    def enqueue(self, step: StepCommit) -> bool | asyncio.Future[bool]:
        """``submit`` without its coroutine (the step hot path awaits one layer less): the
        outcome at once (a lone instance, committed here), else a future settled with it."""
        if not self._pending and not self._writing and self.solo():  # commit right here
            self.batches += 1
            self.steps += 1
            return self.ledger.write([step])[0]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._pending.append((step, fut))
        if self.offload:
            if not self._writing:
                self._writing = True
                loop.create_task(self._write())
        elif len(self._pending) >= self.max_batch:
            self._flush()  # a full batch: write it now, don't let thousands more pile up
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        while self._pending:
            batch = self._take()
            try:
                results = self.ledger.write([s for s, _ in batch])
            except Exception as exc:  # noqa: BLE001 - settled by _settle_error
                self._settle_error(batch, exc)
                continue
            self._settle(batch, results)

    async def _write(self) -> None:
        """Write batches from a thread until nothing is pending (offload mode)."""
        try:
            await asyncio.sleep(0)  # let the steps finishing in this iteration join
            while self._pending:
                batch = self._take()
                try:
                    results = await asyncio.to_thread(self.ledger.write,
                                                      [s for s, _ in batch])
                except asyncio.CancelledError:  # the loop is closing: tell the waiters
                    self._fail(batch, StoreError("group commit stopped; outcome unknown"))
                    raise
                except Exception as exc:  # noqa: BLE001 - settled by _settle_error
                    self._settle_error(batch, exc)
                    continue
                self._settle(batch, results)
        finally:
            self._writing = False
            while self._pending:
                self._fail(self._take(), StoreError("group commit stopped"))

    def _take(self) -> list[tuple[StepCommit, asyncio.Future[bool]]]:
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        return batch

    def _settle(self, batch: list[tuple[StepCommit, asyncio.Future[bool]]],
                results: list[bool]) -> None:
        self.batches += 1
        self.steps += len(batch)
        for (_, fut), ok in zip(batch, results):  # noqa: B905 - no keyword: zip's fast path
            if not fut.done():
                fut.set_result(ok)

    def _settle_error(self, batch: list[tuple[StepCommit, asyncio.Future[bool]]],
                      exc: Exception) -> None:
        """A refused step (``StepRejected``) fails alone and the rest go again; any other
        store failure reaches every waiter of the batch."""
        if isinstance(exc, StepRejected) and 0 <= exc.index < len(batch):
            _, fut = batch.pop(exc.index)
            if not fut.done():
                fut.set_exception(exc)
            self._pending[:0] = batch
            return
        self._fail(batch, exc)

    @staticmethod
    def _fail(batch: list[tuple[StepCommit, asyncio.Future[bool]]], exc: Exception) -> None:
        for _, fut in batch:
            if not fut.done():
                fut.set_exception(exc)


class Coalesced(Generic[A, R]):
    """Calls made in one event-loop iteration, answered by one batch call.

    ``await coalesced(item)`` queues ``item``; at the end of the iteration
    ``batch([item, …])`` runs once (on the loop: one transaction, one round trip
    for the lot) and each caller gets its own result, in order; an exception
    reaches every caller of that batch.  Used for the outbox rows of side
    effects starting together (``Store.outbox_begins``).
    """

    def __init__(self, batch: Callable[[list[A]], Sequence[R]]) -> None:
        self.batch = batch
        self._pending: list[tuple[A, asyncio.Future[R]]] = []
        self.batches = 0

    async def __call__(self, item: A) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((item, fut))
        return await fut

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            results = self.batch([item for item, _ in pending])
        except Exception as exc:  # noqa: BLE001 - every caller of the batch hears it
            for _, fut in pending:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.batches += 1
        for (_, fut), result in zip(pending, results):  # noqa: B905 - no keyword: zip's fast path
            if not fut.done():
                fut.set_result(result)
