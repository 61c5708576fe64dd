"""Ownership: this engine's worker identity, its lease, claims, adoption and release.

An engine is one worker.  It registers a row (``WorkerRow``) and renews it
every ``lease_seconds / 3`` (the heartbeat); the row's ``lease_until`` covers
every instance whose ``owner`` is this worker.  Instances change hands only
through the store: ``Store.claim`` (many at once, skipping rows another
claimer is taking), a compare-and-set adoption of one named instance
(``adoption``), or ``Store.release``.  This module decides what to claim and
give back; the engine's ledger (``runtime.ledger``, handed in as ``writes``: this
floor does not import it) writes it, at the engine's clock.  Every write of a step is fenced by the
instance's version, so a worker that lost an instance (paused past its lease,
its database connection gone) can never commit over the new owner; its
heartbeat then finds the instance missing from ``Store.held`` and stops the
local task.

A lease is renewed only while it holds (``Store.renew_worker``; a takeover ends
it for good, ``store.leases``).  A worker whose renewal is refused has lost
every instance it held, all at once: it stops every local task (``on_lost``
for each), logs a warning and goes on under a new id with a fresh lease
(``rollover``), so it claims work again; the rows of its earlier ids are
deleted once they own nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from ...errors import FsmError, StoreError
from ...store import RUNNING, Store
from ...store.claims import ClaimRequest
from ...store.records import ChildState, InstanceRecord, StepCommit, WorkerRow
from .adoption import adopted, takeover_row
from .liveness import live_ids, new_worker, pid_alive
from .starting import Starting

log = logging.getLogger("fsm_engine")

#: Seconds after its lease ended that a worker row holding nothing is deleted (by any
#: live worker's heartbeat, at most every ``SWEEP_S``): ``fsm workers`` shows a dead
#: worker as expired for that long, then forgets it.
FORGET_S = 300.0
SWEEP_S = 60.0

#: ``on_lost(instance_id, status)``: the heartbeat found the instance no longer ours
#: (``status`` ``"cancelled"``, or ``None`` when another worker took it over).
OnLost = Callable[[str, "str | None"], None]


class LeaseWrites(Protocol):
    """The claim and release writes (``runtime.ledger.Ledger``: the only caller of
    ``Store.claim`` and ``Store.release``, at the engine's clock)."""

    def claim(self, request: ClaimRequest) -> list[InstanceRecord]:
        """``Store.claim`` (``request.now`` read from the writer's clock)."""

    def release(self, owner: str, ids: Sequence[str] | None = None) -> int:
        """``Store.release`` (``updated_at`` from the writer's clock)."""


class Ownership:
    """The leases of one worker (one ``Engine``).

    Args:
        store: where the worker row and the instances live.
        writes: what claims and releases instances (the engine's ``Ledger``).
        lease_seconds: how long a heartbeat keeps this worker's instances
            (renewed every third of it); after that any worker may claim them.
        max_recoveries: adoptions from dead owners without progress before an
            instance fails with reason ``crash_loop`` (checked by the caller).
        clock: epoch seconds.
        queues: the queues this worker serves (recorded on its row, for ``fsm workers``).
    """

    def __init__(self, store: Store, *, writes: LeaseWrites, lease_seconds: float,
                 max_recoveries: int, clock: Callable[[], float] = time.time,
                 queues: Sequence[str] = ()) -> None:
        self.store = store
        self.writes = writes
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
        self._stop: threading.Event | None = None
        self._tick = time.monotonic()
        #: Give back instances held here that no local task has run for two heartbeats
        #: (a long-running worker sets it; an engine that starts instances and runs them
        #: later must not).
        self.release_idle = False
        self._idle: set[str] = set()
        self.starting = Starting(ttl=2 * lease_seconds)  # claimed, no task yet: not idle
        #: Serialises renewals: the heartbeat thread's and a claim's (``register``).
        self._lock = threading.RLock()
        #: Held by a claim: the heartbeat's giving back waits for none (``check``).
        self._claiming = threading.Lock()
        #: Earlier ids of this worker, whose leases were lost (rows deleted once they own
        #: nothing: ``prune``).
        self.retired: list[str] = []
        self._swept = float("-inf")  # when ``sweep`` last ran (this worker's clock)
        #: Stops every local task of a lost lease (set by ``start_heartbeat``).
        self._abandon: Callable[[], int] = lambda: 0

    @property
    def id(self) -> str:
        """This worker's id (the ``owner`` of its instances)."""
        return self.worker.id

    # -- the worker row --------------------------------------------------------------
    def renew(self) -> bool:
        """Register the worker row (a new id: an insert), or renew its lease.

        Returns False when the store refused the renewal (the lease had run out by
        this worker's clock, or a takeover ended it): every instance held under the
        old id is lost; this worker has stopped its local tasks and goes on under a
        new id (``rollover``).  ``StoreError`` when the store cannot be reached.
        """
        with self._lock:
            now = self.clock()
            if not self.registered:
                self.worker.heartbeat_at, self.worker.lease_until = now, now + self.lease_seconds
                self.store.put_worker(self.worker)
                self.registered = True
                return True
            fresh = replace(self.worker, heartbeat_at=now, lease_until=now + self.lease_seconds)
            if self.store.renew_worker(fresh, now):
                self.worker.heartbeat_at, self.worker.lease_until = now, fresh.lease_until
                return True
            self.rollover(now)
            return False

    def rollover(self, now: float) -> None:
        """The lease is lost: stop every local task, then register as a new worker."""
        old = self.worker
        self.retired.append(old.id)
        self.unreleased.clear()  # held under the old id: not ours to give back
        self._idle.clear()
        self._view = None
        self.worker = new_worker(now)
        self.worker.queues = list(old.queues)
        self.registered = False
        dropped = self._abandon()  # after the switch: a stopped task sees the old id as lost
        late = now - (old.lease_until or now)
        log.warning("worker %s lost its lease (%s): dropped the %d instance(s) it ran, going "
                    "on as %s", old.id, f"it ran out {late:.1f} s ago" if late > 0 else
                    "another worker ended it", dropped, self.id)
        self.renew()

    def lease_current(self, owner: str | None) -> bool:
        """True while an instance claimed by ``owner`` is still this worker's to step: the
        claim was made under this worker's current id (a rollover after a lost lease
        gives a new id: what the old one held is lost, also while the new id is still
        being registered: matrix finding M5) and that lease has not run out by this
        worker's clock.  ``owner`` None (not claimed): True; a claim under the current id
        of a worker that never registered (an in-process run): True.

        Checked before a step starts its action or its delivery: a worker whose loop
        stalled past its lease (a long pause, SIGSTOP) may have been taken over, and only
        the new owner may start the instance's next step; an action already running
        finishes, and its commit is refused by the version check."""
        if owner is None:
            return True
        if owner != self.worker.id:
            return False
        return not self.registered or self.clock() < (self.worker.lease_until or 0.0)

    def register(self) -> None:
        """Register the worker row once (before it owns anything); renew a lease that ran
        out by this worker's clock (a paused process) before anything is claimed under it."""
        if not self.registered or self.clock() > (self.worker.lease_until or 0.0):
            self.renew()

    def sweep(self, now: float) -> int:
        """Delete the rows of other workers whose lease ended over ``FORGET_S`` seconds
        before ``now`` and that own no instance (a SIGKILLed worker on another host);
        how many.  Safe against one that comes back: its renewal finds no row, is
        refused, and it goes on under a new id (``rollover``)."""
        gone = 0
        for w in self.store.workers():
            until = w.lease_until if w.lease_until is not None \
                else w.heartbeat_at + self.lease_seconds
            if w.id == self.id or now - until <= FORGET_S or self.store.held(w.id):
                continue
            self.store.delete_worker(w.id)
            gone += 1
        return gone

    def fence(self) -> int:
        """End the database sessions that workers whose lease ran out left inside a
        transaction (``Store.fence``: their row locks would keep those instances from
        every claim, matrix finding M6); how many.  Run by every heartbeat, also while
        this worker's event loop is unresponsive (it may be waiting on such a lock).
        ``StoreError`` when the store cannot be reached."""
        ended = self.store.fence(self.clock(), self.lease_seconds)
        if ended:
            log.warning("worker %s ended %d database session(s) that workers whose lease "
                        "ran out left inside a transaction", self.id, ended)
        return ended

    def prune(self) -> None:
        """Delete the rows of this worker's earlier ids that own no instance any more.
        Two may run at once (``close`` does not wait for the heartbeat's thread): an id
        the other removed first is done with (the row's delete is idempotent)."""
        for old in list(self.retired):
            if not self.store.held(old):
                self.store.delete_worker(old)
                with contextlib.suppress(ValueError):
                    self.retired.remove(old)

    def start_heartbeat(self, on_lost: OnLost, running: Callable[[], Iterable[str]]) -> None:
        """Register and keep renewing (idempotent; call from the running loop).

        The lease is renewed from a thread of its own, so a busy or CPU-starved
        event loop does not lose it; but only while the loop itself still runs: a
        task on the loop ticks every third of the lease, and a loop silent for a
        whole lease (stuck in a blocking call) stops the renewals, so its
        instances go to other workers rather than to a zombie.
        """
        self.register()
        if self._heartbeat is not None and not self._heartbeat.done():
            return
        loop = asyncio.get_running_loop()
        self._abandon = lambda: self._drop_all(loop, on_lost, running)
        self._tick = time.monotonic()
        self._heartbeat = loop.create_task(self._ticks(loop, on_lost, running))
        self._stop = threading.Event()
        thread = threading.Thread(target=self._renewals, name="fsm-heartbeat", daemon=True,
                                  args=(loop, self._stop, on_lost, running))
        thread.start()

    #: Renew from the loop's own ticks too (a virtual clock, ``testing.VirtualClock``:
    #: the renewal thread waits real seconds while the engine's time skips ahead).
    renew_on_loop = False

    async def _ticks(self, loop: asyncio.AbstractEventLoop, on_lost: OnLost,
                     running: Callable[[], Iterable[str]]) -> None:
        while True:
            self._tick = time.monotonic()
            await asyncio.sleep(self.lease_seconds / 3)
            if self.renew_on_loop:
                self._beat(loop, on_lost, running)

    def _renewals(self, loop: asyncio.AbstractEventLoop, stop: threading.Event,
                  on_lost: OnLost, running: Callable[[], Iterable[str]]) -> None:
        while not stop.wait(self.lease_seconds / 3):
            if loop.is_closed() or not loop.is_running():
                return  # the loop ended (e.g. asyncio.run returned): nothing left to keep
            if time.monotonic() - self._tick > self.lease_seconds:
                log.warning("worker %s: event loop unresponsive, not renewing its lease", self.id)
                # the loop may be waiting on a row lock a stopped worker holds: end it
                try:
                    self.fence()
                except StoreError as exc:
                    log.warning("heartbeat of %s failed (retrying): %s", self.id, exc)
                continue
            if not self._beat(loop, on_lost, running):
                return

    def _beat(self, loop: asyncio.AbstractEventLoop, on_lost: OnLost,
              running: Callable[[], Iterable[str]]) -> bool:
        """One renewal: the instances found lost go to ``on_lost`` on ``loop``; False when
        beating should stop (the store is closed, the loop is gone)."""
        try:
            lost = self.check(list(running()))
        except StoreError as exc:
            log.warning("heartbeat of %s failed (retrying): %s", self.id, exc)
            return True
        except Exception:  # noqa: BLE001 - the store is gone (closed): stop beating
            return False
        for iid, status in lost:
            try:
                loop.call_soon_threadsafe(on_lost, iid, status)
            except RuntimeError:  # the loop has closed
                return False
        return True

    @staticmethod
    def _drop_all(loop: asyncio.AbstractEventLoop, on_lost: OnLost,
                  running: Callable[[], Iterable[str]]) -> int:
        """``on_lost(id, None)`` on ``loop`` for every instance running here (from any
        thread); how many."""
        for _ in range(3):
            try:
                ids = list(running())
                break
            except RuntimeError:  # changed size while read from this thread: read again
                continue
        else:
            return 0
        for iid in ids:
            try:
                loop.call_soon_threadsafe(on_lost, iid, None)
            except RuntimeError:  # the loop has closed: nothing runs any more
                return 0
        return len(ids)

    def check(self, running: Sequence[str]) -> list[tuple[str, str | None]]:
        """Renew, then compare what runs here with what the store says we hold.

        Returns ``(id, status)`` for each running instance lost: ``cancelled``
        (released here), or ``None`` when another worker owns it now.  A refused
        renewal returns ``[]``: every local task was stopped already (``rollover``).
        """
        if not self.renew():
            return []
        self._housekeep()
        held = self.store.held(self.id)
        cancelled = [iid for iid, status in held.items() if status == "cancelled"]
        if cancelled:
            self.writes.release(self.id, cancelled)  # seen: drop them from the next check
        # what is given back is judged and released with no claim under way (a claim in
        # between would be given back: matrix finding A2); a claim under way (it may wait
        # on a lock) puts the giving back off to the next check, never the renewal
        if self._claiming.acquire(blocking=False):
            try:
                self._give_back(held, running)
            finally:
                self._claiming.release()
        return [(iid, "cancelled") for iid in cancelled] + self._taken_over(running, held)

    def _give_back(self, held: Mapping[str, str], running: Sequence[str]) -> None:
        """Retry the releases a store failure refused; give back what no task ran."""
        if self.unreleased:  # the store works again: give back what a failed run held
            self.release(sorted(set(self.unreleased) - set(running)))
        if self.release_idle:
            self._give_back_idle(held, set(running))

    def _housekeep(self) -> None:
        """Prune retired rows, end the sessions dead workers left inside a transaction
        (``fence``), sweep dead workers now and then."""
        if self.retired:
            self.prune()
        self.fence()
        now = self.clock()
        if now - self._swept >= SWEEP_S:
            self._swept = now
            self.sweep(now)

    def _give_back_idle(self, held: Mapping[str, str], running: set[str]) -> None:
        """Release instances held here that no task ran at this check and the last one."""
        busy = running | self.starting.current()
        idle = {iid for iid, status in held.items() if status != "cancelled" and iid not in busy}
        stale = sorted(idle & self._idle)  # idle at the last check too
        if stale:
            log.warning("worker %s gives back %d instance(s) no task ran", self.id, len(stale))
            self.writes.release(self.id, stale)
        self._idle = idle - set(stale)

    def _taken_over(self, running: Sequence[str], held: Mapping[str, str]
                    ) -> list[tuple[str, str | None]]:
        """``(id, None)`` for each instance running here that another worker owns now."""
        lost: list[tuple[str, str | None]] = []
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

    def started(self, iid: str) -> None:
        """A task here runs (or ran) ``iid``, claimed here: see ``fleet.starting``."""
        self.starting.started(iid)

    def release(self, ids: Sequence[str]) -> None:
        """Give up this worker's claim on ``ids`` (a run that broke off on a store failure
        or an unexpected error), so any worker may claim them; when the store refuses,
        the heartbeat retries."""
        self.unreleased.update(ids)
        try:
            self.writes.release(self.id, list(ids))
        except FsmError as exc:
            log.warning("cannot release %s yet: %s", ", ".join(ids), exc)
            return
        self.unreleased.difference_update(ids)

    def stop_heartbeat(self) -> None:
        """Stop the heartbeat (task and thread)."""
        if self._stop is not None:
            self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    def close(self, keep: Collection[str] = ()) -> None:
        """Give back every instance held here but ``keep`` (one release; a
        store that refuses is logged), then deregister (what ``keep`` names stays owned by
        a worker that is gone: the next claim records a takeover)."""
        self.stop_heartbeat()
        if self.retired:
            self.prune()
        if self.registered:
            try:
                ids = None if not keep else [i for i in self.store.held(self.id) if i not in keep]
                if ids is None or ids:
                    self.writes.release(self.id, ids)
            except FsmError as exc:
                log.warning("worker %s cannot give its instances back: %s", self.id, exc)
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
        """Registered workers of this host whose process is gone: their leases count as
        expired at once.  (An expired lease the store judges itself, from fresh rows:
        this view may be half a second old.)"""
        workers, _ = self.view(now)
        return [w.id for w in workers.values() if not pid_alive(w)]

    # -- taking instances -----------------------------------------------------------------
    def claim(self, limit: int, *, due_by: float | None = None,
              machines: Sequence[str] | None = None, queues: Sequence[str] | None = None,
              skip_queues: Sequence[str] = (), queue_limit: int | None = None,
              partition_limit: int | None = None) -> list[InstanceRecord]:
        """Claim up to ``limit`` runnable instances nobody live holds (see ``Store.claim``
        and ``ClaimRequest`` for the queue and partition limits)."""
        self.register()
        with self._claiming:  # the heartbeat gives nothing back meanwhile (``check``)
            now = self.clock()
            claimed = self.writes.claim(ClaimRequest(
                self.id, now, limit=limit, lease_seconds=self.lease_seconds,
                dead=self.dead(now), due_by=due_by, machines=machines, queues=queues,
                skip_queues=skip_queues, queue_limit=queue_limit,
                partition_limit=partition_limit))
            self.starting.claimed(rec.id for rec in claimed)
            for rec in claimed:  # a new claim: what was left to give back of an old one
                self.unreleased.discard(rec.id)  # is not to be given back now (finding A2)
                self._idle.discard(rec.id)
        return claimed

    def adoption(self, rec: InstanceRecord) -> StepCommit:
        """The compare-and-set commit making this worker the owner of ``rec`` (with its
        ``recovery`` history row when it takes ``rec`` over from another owner).

        Raises ``FsmError`` when a live worker holds it.
        """
        now = self.clock()
        if rec.owner is None or rec.owner == self.id:
            return StepCommit(adopted(rec, self.id, now, None), rec.version, before=rec)
        self._view = None  # judged on fresh rows: a cached lease may have been renewed
        workers, live = self.view(now)
        if rec.owner in live:
            raise FsmError(f"instance {rec.id} is being run by live worker {rec.owner}",
                           instance_id=rec.id)
        prior = workers.get(rec.owner)
        alive = prior is not None and pid_alive(prior)
        if alive and not self.store.end_lease(
                rec.owner, now, self.lease_seconds):  # it renewed since: not ours to take
            raise FsmError(f"instance {rec.id} is being run by live worker {rec.owner}",
                           instance_id=rec.id)
        beat = None if prior is None else prior.heartbeat_at
        cause = ("deregistered" if prior is None
                 else "lease_expired" if alive else "process_gone")
        new = adopted(rec, self.id, now, beat)
        row = takeover_row(rec, new, now, beat, cause)
        return StepCommit(new, rec.version, history=[row] if row else [], before=rec)

    def can_take(self, rec: InstanceRecord | ChildState) -> bool:
        """True when ``rec`` is unowned, owned here, or owned by a worker known dead."""
        if rec.owner is None or rec.owner == self.id:
            return True
        return rec.owner not in self.view(self.clock())[1]

    def crash_looping(self, rec: InstanceRecord) -> bool:
        """True when ``rec`` was adopted more than ``max_recoveries`` times without progress."""
        return rec.status == RUNNING and rec.recoveries > self.max_recoveries

    def resumable(self) -> list[InstanceRecord]:
        """Instances not held by a live worker that a step would move (a read; claims
        nothing): non-final, non-waiting ones, and waiting ones whose timer is due."""
        now, live = self.clock(), self.view(self.clock())[1]
        return [r for r in self.store.list(statuses=["pending", RUNNING, "waiting"])
                if (r.status != "waiting" or (r.next_attempt_at or now + 1) <= now)
                and (r.owner is None or r.owner == self.id or r.owner not in live)]
