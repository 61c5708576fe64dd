"""Group commit: steps of many instances that finish together share one transaction.

Each ``submit`` queues a ``StepCommit`` and waits.  The first submission in
an event-loop iteration schedules a flush with ``call_soon``, so everything
submitted before the loop comes round again is written by one
``Store.commit`` call (one ``BEGIN … COMMIT``, one fsync), each step still
all-or-nothing (the store applies a step only when its version matches).
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
"""

from __future__ import annotations

import asyncio
from typing import Callable

from ..errors import StepRejected
from ..store.base import Store
from ..store.records import StepCommit


class GroupCommitter:
    """Batches ``StepCommit``s from concurrent steps into single transactions.

    A batch is written at the end of the event-loop iteration, or as soon as
    ``max_batch`` steps are waiting (default 500: large enough to amortise the
    fsync, small enough that the first steps of a 10,000-instance resume are
    durable within a fraction of a second).
    """

    def __init__(self, store: Store, max_batch: int = 500,
                 solo: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.max_batch = max_batch
        self.solo = solo
        self._pending: list[tuple[StepCommit, asyncio.Future[bool]]] = []
        self._scheduled = False
        self.batches = 0
        self.steps = 0

    async def submit(self, step: StepCommit) -> bool:
        """Queue ``step``; return True once durably committed, False when stale.

        A step the store refuses (``StepRejected``: a value it cannot encode,
        a constraint) raises for that step alone; the rest of its batch is
        committed without it.  Any other store error (disk full, I/O error,
        database gone) reaches every step of the failed batch.
        """
        if not self._pending and self.solo():  # nothing to batch with: commit right here
            self.batches += 1
            self.steps += 1
            return self.store.commit([step])[0]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._pending.append((step, fut))
        if len(self._pending) >= self.max_batch:
            self._flush()  # a full batch: write it now, don't let thousands more pile up
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                results = self.store.commit([s for s, _ in batch])
            except StepRejected as exc:  # that step alone: the others go again without it
                if 0 <= exc.index < len(batch):
                    _, fut = batch.pop(exc.index)
                    if not fut.done():
                        fut.set_exception(exc)
                    self._pending[:0] = batch
                    continue
                self._fail(batch, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a store failure: every waiter hears it
                self._fail(batch, exc)
                continue
            self.batches += 1
            self.steps += len(batch)
            for (_, fut), ok in zip(batch, results):
                if not fut.done():
                    fut.set_result(ok)

    @staticmethod
    def _fail(batch: list[tuple[StepCommit, "asyncio.Future[bool]"]], exc: Exception) -> None:
        for _, fut in batch:
            if not fut.done():
                fut.set_exception(exc)
