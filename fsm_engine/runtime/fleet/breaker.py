"""Circuit breaker per provider + model, its state shared through the store.

Every process and every instance using the same ``name`` sees one breaker:
the state lives in the store's ``breakers`` table and is updated by
compare-and-set, so two processes cannot both take the half-open probe.
Thresholds come from :class:`fsm_engine.policies.BreakerPolicy`.

Within one process the row is read and written once per event-loop iteration, not
once per call: calls that start in the same iteration share one read of a closed
breaker, and the outcomes recorded in one iteration are written by one
compare-and-set (in the order they were recorded), the way the group committer
batches steps.  A thousand concurrent calls thus cost two small transactions, not
two thousand (each with its fsync and a decode of the window's events).

The window is stored as counts per bucket, ``[bucket start, successes, failures]``
with ``BUCKETS`` buckets per window (a 60 s window: one per second), the way
resilience4j's time-based sliding window aggregates per epoch second, so the row
holds at most ``BUCKETS + 1`` entries whatever the call rate (a row of one entry per
call grew to ~2,000 entries, 51 KB of JSON, in a minute of a 4-worker fleet, read
once per few calls).  A call counts while its bucket started within the window: up
to one bucket width (``window / BUCKETS``) longer than its own time would.  Rows
written as one ``[time, ok]`` entry per call are read as buckets of one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ...errors import CircuitOpen, StoreError
from ...policies import BreakerPolicy
from ...store.base import Store
from ...store.records import BreakerRow

log = logging.getLogger("fsm_engine")

#: Buckets per window (see the module doc).
BUCKETS = 60


class Breaker:
    """closed → (failure rate over the window ≥ threshold) → open → (cooldown) →
    half_open: one probe call → success closes, failure reopens."""

    def __init__(self, store: Store, name: str, policy: BreakerPolicy | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.name = name
        self.policy = policy or BreakerPolicy()
        self.clock = clock
        #: True while a read of this iteration found the breaker closed (cleared by the loop).
        self._closed_seen = False
        self._last_state = "closed"
        self._pending: list[tuple[bool, asyncio.Future[None]]] = []

    def _prune(self, row: BreakerRow, now: float) -> None:
        """Keep the buckets still in the window, each as ``[start, successes, failures]``."""
        keep = self.policy.window + self.policy.window / BUCKETS  # a bucket ends width later
        row.events = [e if len(e) == 3 else [e[0], int(bool(e[1])), int(not e[1])]
                      for e in row.events if now - e[0] <= keep]

    def _count(self, row: BreakerRow, now: float, ok: bool) -> None:
        """Add one outcome to the bucket of ``now`` (a new bucket when time moved on)."""
        width = self.policy.window / BUCKETS
        start = now - now % width
        if not row.events or row.events[-1][0] != start:
            row.events.append([start, 0, 0])
        row.events[-1][1 if ok else 2] += 1

    async def before_call(self) -> None:
        """Return when a call may go ahead; raise ``CircuitOpen`` when it may not.

        When the store cannot be read (``StoreError``: the database restarting, a dropped
        connection) the call goes ahead: the breaker is advice shared through the store,
        and the model does not depend on the database (the step's own commit does, and
        the runtime retries that)."""
        if self._closed_seen:  # read closed in this event-loop iteration already
            return
        try:
            self.check()
            if self._last_state == "closed":  # and so it is for every call until the loop
                self._closed_seen = True      # comes round (or an outcome is written)
                asyncio.get_running_loop().call_soon(self._forget)
        except StoreError as exc:
            log.warning("breaker %s unreadable, letting the call through: %s", self.name, exc)

    def _forget(self) -> None:
        self._closed_seen = False

    def check(self) -> None:
        """Synchronous ``before_call``; raises ``CircuitOpen`` (seconds to next probe in ``retry_in``)."""
        while True:
            row, now = self.store.get_breaker(self.name), self.clock()
            self._last_state = row.state
            if row.state == "closed":
                return
            started = row.probe_at if row.state == "half_open" else row.opened_at
            since = now - (now if started is None else started)
            if since < self.policy.cooldown:
                raise CircuitOpen(self.name, self.policy.cooldown - since)
            expected = row.version
            row.state, row.probe_at = "half_open", now
            if self.store.put_breaker(row, expected):
                return  # this caller is the probe

    async def record(self, ok: bool) -> None:
        """Record a call's outcome (``ok`` False only for retryable provider failures); an
        outcome the store cannot take (``StoreError``) is dropped, never the call's result.
        Returns once the outcome is stored, together with the others of this iteration."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((ok, fut))
        await fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self._closed_seen = False  # the row changes: the next call reads it again
        try:
            self._record([ok for ok, _ in batch])
        except StoreError as exc:
            log.warning("breaker %s: %d outcome(s) not recorded: %s", self.name, len(batch), exc)
        for _, fut in batch:
            if not fut.done():
                fut.set_result(None)

    def _record(self, oks: list[bool]) -> None:
        """Apply ``oks`` in order to the stored row by one compare-and-set (retried)."""
        while True:
            row, now = self.store.get_breaker(self.name), self.clock()
            expected = row.version
            self._prune(row, now)
            calls = sum(e[1] + e[2] for e in row.events)
            fails = sum(e[2] for e in row.events)
            changed = False
            for ok in oks:
                if row.state == "half_open":
                    if ok:
                        row.state, row.events, row.opened_at, row.probe_at = \
                            "closed", [], None, None
                        calls = fails = 0
                    else:
                        row.state, row.opened_at, row.probe_at = "open", now, None
                elif row.state == "closed":
                    self._count(row, now, ok)
                    calls, fails = calls + 1, fails + (not ok)
                    if self.policy.should_open(calls - fails, fails):
                        row.state, row.opened_at = "open", now
                else:
                    continue  # a late result while open changes nothing
                changed = True
            if not changed or self.store.put_breaker(row, expected):
                return

    def state(self) -> str:
        """``closed``, ``open`` or ``half_open`` as stored now."""
        return self.store.get_breaker(self.name).state
