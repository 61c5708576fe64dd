"""Group commit: steps of many instances that finish together share one transaction.

Each ``submit`` queues a ``StepCommit`` and waits.  Everything submitted
before the event loop comes round again is handed, as one batch, to a
writer thread that applies it with one ``Store.commit`` call (one
``BEGIN … COMMIT``, one fsync), each step still all-or-nothing (the store
applies a step only when its version matches).  While the writer is busy,
new submissions pile up and go as the next batch the moment it returns, so
batches grow with the load and the event loop keeps stepping other
instances while SQLite writes and fsyncs (it releases the GIL for both).

This is the classic group commit of database logs (Gawlick & Kinkade, 1985;
PostgreSQL's ``commit_delay`` and WAL writer), without a delay: batching
comes from concurrency alone.  When the engine runs a single instance
(``solo``) a commit is made inline on the event loop instead: nothing could
share its transaction, and a thread hop would only add latency.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from ..store.base import Store
from ..store.records import StepCommit
from .threads import ActionThreads

_Waiting = list[tuple[StepCommit, "asyncio.Future[bool]"]]


class GroupCommitter:
    """Batches ``StepCommit``s from concurrent steps into single transactions.

    One batch is in flight at a time; a batch holds at most ``max_batch``
    steps (default 500: large enough to amortise the fsync, small enough
    that the first steps of a 10,000-instance resume are durable within a
    fraction of a second).  ``batches``/``steps`` count what was committed.
    """

    def __init__(self, store: Store, max_batch: int = 500,
                 solo: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.max_batch = max_batch
        self.solo = solo
        self._pending: _Waiting = []
        self._scheduled = False
        self._in_flight = False
        self._writer = ActionThreads(1, name="fsm-writer")
        self.batches = 0
        self.steps = 0

    async def submit(self, step: StepCommit) -> bool:
        """Queue ``step``; return True once durably committed, False when stale.

        Store errors propagate to every step of the failed batch.
        """
        if not self._pending and not self._in_flight and self.solo():
            self.batches += 1  # nothing to batch with: commit right here
            self.steps += 1
            return self.store.commit([step])[0]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._pending.append((step, fut))
        if not self._scheduled and not self._in_flight:
            self._scheduled = True
            loop.call_soon(self._hand_off)
        return await fut

    def _hand_off(self) -> None:
        """Send the next batch to the writer thread (on the loop; one batch in flight)."""
        self._scheduled = False
        if self._in_flight or not self._pending:
            return
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        self._in_flight = True
        done = self._writer.submit(self.store.commit, [s for s, _ in batch])
        done.add_done_callback(lambda f: self._settle(batch, f))

    def _settle(self, batch: _Waiting, done: "asyncio.Future[list[bool]]") -> None:
        self._in_flight = False
        exc = None if done.cancelled() else done.exception()
        if done.cancelled() or exc is not None:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc or asyncio.CancelledError())
        else:
            self.batches += 1
            self.steps += len(batch)
            for (_, fut), ok in zip(batch, done.result()):
                if not fut.done():
                    fut.set_result(ok)
        self._hand_off()  # whatever piled up meanwhile goes now

    def close(self) -> None:
        """Stop the writer thread (call when no commit is waiting)."""
        self._writer.shutdown()
