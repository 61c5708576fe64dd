"""Circuit breaker per provider + model, its state shared through the store.

Every process and every instance using the same ``name`` sees one breaker:
the state lives in the store's ``breakers`` table and is updated by
compare-and-set, so two processes cannot both take the half-open probe.
Thresholds come from :class:`fsm_engine.policies.BreakerPolicy`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from ..errors import CircuitOpen, StoreError
from ..policies import BreakerPolicy
from ..store.base import Store
from ..store.records import BreakerRow


log = logging.getLogger("fsm_engine")


class Breaker:
    """closed → (failure rate over the window ≥ threshold) → open → (cooldown) →
    half_open: one probe call → success closes, failure reopens."""

    def __init__(self, store: Store, name: str, policy: BreakerPolicy | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.name = name
        self.policy = policy or BreakerPolicy()
        self.clock = clock

    def _prune(self, row: BreakerRow, now: float) -> None:
        row.events = [e for e in row.events if now - e[0] <= self.policy.window]

    async def before_call(self) -> None:
        """Return when a call may go ahead; raise ``CircuitOpen`` when it may not.

        When the store cannot be read (``StoreError``: the database restarting, a dropped
        connection) the call goes ahead: the breaker is advice shared through the store,
        and the model does not depend on the database (the step's own commit does, and
        the runtime retries that)."""
        try:
            self.check()
        except StoreError as exc:
            log.warning("breaker %s unreadable, letting the call through: %s", self.name, exc)

    def check(self) -> None:
        """Synchronous ``before_call``; raises ``CircuitOpen`` (seconds to next probe in ``retry_in``)."""
        while True:
            row, now = self.store.get_breaker(self.name), self.clock()
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
        outcome the store cannot take (``StoreError``) is dropped, never the call's result."""
        try:
            self._record(ok)
        except StoreError as exc:
            log.warning("breaker %s: outcome not recorded: %s", self.name, exc)

    def _record(self, ok: bool) -> None:
        while True:
            row, now = self.store.get_breaker(self.name), self.clock()
            expected = row.version
            if row.state == "half_open":
                if ok:
                    row.state, row.events, row.opened_at, row.probe_at = "closed", [], None, None
                else:
                    row.state, row.opened_at, row.probe_at = "open", now, None
            elif row.state == "closed":
                row.events.append([now, ok])
                self._prune(row, now)
                fails = sum(1 for e in row.events if not e[1])
                if self.policy.should_open(len(row.events) - fails, fails):
                    row.state, row.opened_at = "open", now
            else:
                return  # a late result while open changes nothing
            if self.store.put_breaker(row, expected):
                return

    def state(self) -> str:
        """``closed``, ``open`` or ``half_open`` as stored now."""
        return self.store.get_breaker(self.name).state
