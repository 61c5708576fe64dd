"""Ownership: this engine's worker identity, its lease, claims, adoption and release.

An engine is one worker.  It registers a row (``WorkerRow``) and renews it
every ``lease_seconds / 3`` (the heartbeat); the row's ``lease_until`` covers
every instance whose ``owner`` is this worker.  Instances change hands only
through the store: ``Store.claim`` (many at once, skipping rows another
claimer is taking), a compare-and-set adoption of one named instance
(``adoption``), or ``Store.release``.  Every write of a step is fenced by the
instance's version, so a worker that lost an instance (paused past its lease,
its database connection gone) can never commit over the new owner; its
heartbeat then finds the instance missing from ``Store.held`` and stops the
local task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable, Sequence

from ..errors import FsmError, StoreError
from ..store import RUNNING, Store
from ..store.claims import ClaimRequest, adopted
from ..store.records import InstanceRecord, StepCommit, WorkerRow
from .workers import live_ids, new_worker

log = logging.getLogger("fsm_engine")

#: ``on_lost(instance_id, status)``: the heartbeat found the instance no longer ours
#: (``status`` ``"cancelled"``, or ``None`` when another worker took it over).
OnLost = Callable[[str, "str | None"], None]


class Ownership:
    """The leases of one worker (one ``Engine``).

    Args:
        store: where the worker row and the instances live.
        lease_seconds: how long a heartbeat keeps this worker's instances
            (renewed every third of it); after that any worker may claim them.
        max_recoveries: adoptions from dead owners without progress before an
            instance fails with reason ``crash_loop`` (checked by the caller).
        clock: epoch seconds.
        queues: the queues this worker serves (recorded on its row, for ``fsm workers``).
    """

    def __init__(self, store: Store, *, lease_seconds: float, max_recoveries: int,
                 clock: Callable[[], float] = time.time, queues: Sequence[str] = ()) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.max_recoveries = max_recoveries
        self.clock = clock
        self.worker: WorkerRow = new_worker(clock())
        self.worker.queues = list(queues)
        self.registered = False
        self._view: tuple[float, dict[str, WorkerRow], set[str]] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        #: Instances whose release failed (the store was unusable): retried by ``check``.
        self.unreleased: set[str] = set()

    @property
    def id(self) -> str:
        """This worker's id (the ``owner`` of its instances)."""
        return self.worker.id

    # -- the worker row --------------------------------------------------------------
    def renew(self) -> None:
        """Write the worker row with a fresh heartbeat and lease."""
        now = self.clock()
        self.worker.heartbeat_at, self.worker.lease_until = now, now + self.lease_seconds
        self.store.put_worker(self.worker)
        self.registered = True

    def register(self) -> None:
        """Register the worker row once (before it owns anything)."""
        if not self.registered:
            self.renew()

    def start_heartbeat(self, on_lost: OnLost, running: Callable[[], Iterable[str]]) -> None:
        """Register and keep renewing from a task on the running loop (idempotent)."""
        self.register()
        if self._heartbeat is None or self._heartbeat.done():
            loop = asyncio.get_running_loop()
            self._heartbeat = loop.create_task(self._beat(on_lost, running))

    async def _beat(self, on_lost: OnLost, running: Callable[[], Iterable[str]]) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:  # off the loop: over a network a store call may take a while
                lost = await asyncio.to_thread(self.check, list(running()))
            except StoreError as exc:
                log.warning("heartbeat of %s failed (retrying): %s", self.id, exc)
                continue
            for iid, status in lost:
                on_lost(iid, status)

    def check(self, running: Sequence[str]) -> list[tuple[str, str | None]]:
        """Renew, then compare what runs here with what the store says we hold.

        Returns ``(id, status)`` for each running instance lost: ``cancelled``
        (released here), or ``None`` when another worker owns it now.
        """
        self.renew()
        if self.unreleased:  # the store works again: give back what a failed run held
            self.release(sorted(set(self.unreleased) - set(running)))
        held = self.store.held(self.id)
        lost: list[tuple[str, str | None]] = []
        cancelled = [iid for iid, status in held.items() if status == "cancelled"]
        if cancelled:
            self.store.release(self.id, cancelled)  # seen: drop them from the next check
            lost.extend((iid, "cancelled") for iid in cancelled)
        for iid in running:
            if iid in held:
                continue
            try:
                rec = self.store.get(iid)
            except FsmError:
                continue
            if not rec.final and rec.owner not in (None, self.id) and rec.status != "waiting":
                log.warning("instance %s was taken over by %s: this worker lost its lease",
                            iid, rec.owner)
                lost.append((iid, None))
        return lost

    def release(self, ids: Sequence[str]) -> None:
        """Give up this worker's claim on ``ids`` (a run that broke off on a store failure
        or an unexpected error), so any worker may claim them; when the store refuses,
        the heartbeat retries."""
        self.unreleased.update(ids)
        try:
            self.store.release(self.id, list(ids))
        except FsmError as exc:
            log.warning("cannot release %s yet: %s", ", ".join(ids), exc)
            return
        self.unreleased.difference_update(ids)

    def stop_heartbeat(self) -> None:
        """Cancel the heartbeat task."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    def close(self) -> None:
        """Deregister (the instances it still owns become claimable at once)."""
        self.stop_heartbeat()
        if self.registered:
            self.store.delete_worker(self.id)
            self.registered = False

    # -- who is alive ------------------------------------------------------------------
    def view(self, now: float) -> tuple[dict[str, WorkerRow], set[str]]:
        """Registered workers and the live ones, re-read at most every 0.5 s."""
        if self._view is None or now - self._view[0] > 0.5:
            workers = {w.id: w for w in self.store.workers()}
            self._view = (now, workers, live_ids(list(workers.values()), now, self.lease_seconds))
        return self._view[1], self._view[2]

    def dead(self, now: float) -> list[str]:
        """Registered workers known dead (lease over, or a gone pid on this host)."""
        workers, live = self.view(now)
        return [wid for wid in workers if wid not in live]

    # -- taking instances -----------------------------------------------------------------
    def claim(self, limit: int, *, due_by: float | None = None,
              machines: Sequence[str] | None = None) -> list[InstanceRecord]:
        """Claim up to ``limit`` runnable instances nobody live holds (see ``Store.claim``)."""
        self.register()
        now = self.clock()
        return self.store.claim(ClaimRequest(
            self.id, now, limit=limit, lease_seconds=self.lease_seconds, dead=self.dead(now),
            due_by=due_by, machines=machines))

    def adoption(self, rec: InstanceRecord) -> StepCommit:
        """The compare-and-set commit making this worker the owner of ``rec``.

        Raises ``FsmError`` when a live worker holds it.
        """
        now = self.clock()
        if rec.owner is not None and rec.owner != self.id:
            workers, live = self.view(now)
            if rec.owner in live:
                raise FsmError(f"instance {rec.id} is being run by live worker {rec.owner}",
                               instance_id=rec.id)
            prior = workers.get(rec.owner)
            new = adopted(rec, self.id, now, None if prior is None else prior.heartbeat_at)
        else:
            new = adopted(rec, self.id, now, None)
        return StepCommit(new, rec.version, before=rec)

    def crash_looping(self, rec: InstanceRecord) -> bool:
        """True when ``rec`` was adopted more than ``max_recoveries`` times without progress."""
        return rec.status == RUNNING and rec.recoveries > self.max_recoveries

    def resumable(self) -> list[InstanceRecord]:
        """Non-final, non-waiting instances not held by a live worker (a read; claims nothing)."""
        _, live = self.view(self.clock())
        return [r for r in self.store.list(statuses=["pending", RUNNING])
                if r.owner is None or r.owner == self.id or r.owner not in live]
