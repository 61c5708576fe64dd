"""A long-running worker: claim runnable instances from a shared store, run them, repeat.

``Worker.serve`` is what ``fsm worker`` runs.  Any number of workers, on any
number of hosts, may share one store: each claims instances through
``Store.claim`` (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the write lock on
SQLite), so no instance is run by two workers at once, and each holds its
instances by a lease its heartbeat renews (a worker refused a renewal, paused past
its lease, has lost them all: it drops them and goes on under a new id, see
``runtime.fleet.ownership``).  An idle worker sleeps in
``Store.wait_for_work`` (PostgreSQL ``LISTEN``: woken the moment an instance
is started or released; SQLite: polled) and claims again at least every
``poll`` seconds, which also picks up instances whose owner died (lease
expired); sooner when a timer or a delayed start falls due before the next poll
(``Store.next_due``, read when a claim leaves slots free, at most once a poll).  A store
error (the database restarting, the network gone) is survived: claims back off and
retry, and an instance whose step failed to commit is given back once the store answers
again, then claimed afresh (its step runs again; a commit either applied or not, never
half).  Queues, per-queue and per-partition limits: see ``runtime.fleet.queues``; the fleet's stored limits
(``fsm limits``, ``runtime.fleet.limits``) are read again every ``fleet.REFRESH_S`` seconds
and tighten the worker's own.  Every worker also fires the store's due schedule ticks in
its poll loop (``runtime.schedules``: one instance per tick across the fleet), waking for
the next tick when it comes before the next poll.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..errors import FsmError, StaleWrite, StoreError
from ..store.records import InstanceRecord
from .engine import Engine
from .fleet import limits as fleet
from .fleet.queues import QueuePlan

log = logging.getLogger("fsm_engine")

#: Longest pause between two attempts to reach a store that fails (seconds).
MAX_BACKOFF = 5.0


class Worker:
    """Serves one engine's share of a store until ``stop``.

    Args:
        engine: the engine (its store, provider, lease and identity) to run with.
        concurrency: most instances stepping at once in this worker (when no ``plan``).
        machines: claim only instances of these machine names (``None``: any
            machine, loaded from the reference each instance records).
        poll: most seconds between two claims while idle.
        grace: seconds ``stop`` lets in-flight instances run before cancelling
            and releasing them.
        plan: the queues served and the limits per queue and partition
            (``runtime.fleet.queues.QueuePlan``; default: every queue, ``concurrency`` in all).
        schedules: fire the store's due schedule ticks (``Engine.schedules.fire_due``).
    """

    def __init__(self, engine: Engine, *, concurrency: int = 32,
                 machines: Sequence[str] | None = None, poll: float = 1.0,
                 grace: float = 10.0, plan: QueuePlan | None = None,
                 schedules: bool = True) -> None:
        self.engine = engine
        #: When (epoch seconds, the engine's clock) the schedules are looked at next.
        self._ticks_at = float("-inf") if schedules else float("inf")
        #: The plan as given (flags); ``plan`` is it under the fleet's stored limits.
        self.own_plan = self.plan = plan or QueuePlan(total=concurrency)
        self._limits_at = float("-inf")  # monotonic time the stored limits were read
        self.limits: fleet.FleetLimits | None = None
        self.runner = engine.runner  # everything below goes through its public API
        self.runner.limits_read = True  # read here, off the loop, before each claim round
        self.concurrency = self.plan.total
        # a batch as large as the slots: the steps of one claim commit together (at the
        # default 500 a claim of 512 due timers committed as 500 + 12, and the 12 freed
        # slots were claimed apart: two claims and two commits per round)
        committer = engine.committer
        committer.max_batch = max(committer.max_batch, self.concurrency)
        self.machines = None if machines is None else list(machines)
        #: The queue of each instance running here (moved on when it stays across a boundary).
        self._queue: dict[str, str] = {}
        self.runner.worker.queues = list(self.plan.serve or [])
        self.poll = poll
        self.grace = grace
        self.completed = 0
        self._running: dict[str, asyncio.Task[None]] = {}
        self._orphans: set[str] = set()
        self._parked: set[str] = set()  # told once in the log; the instance says it anyway
        self._stopping: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._waiter: asyncio.Future[None] | None = None
        #: The next due time the last unfilled claim saw (``Store.next_due``; engine clock).
        self._due_at: float | None = None
        self._due_read_at = float("-inf")  # when (engine clock) ``_due_at`` is read again

    @property
    def id(self) -> str:
        """The worker id (``owner`` of the instances it holds)."""
        return self.runner.worker.id

    def stop(self) -> None:
        """Ask ``serve`` to drain and return (safe from a signal handler on the loop)."""
        if self._stopping is not None:
            self._stopping.set()

    async def serve(self) -> None:
        """Claim and run instances until ``stop``; then drain, release and deregister."""
        self._stopping, self._wake = asyncio.Event(), asyncio.Event()
        backoff = 0.05
        await self._call(self.runner.ownership.register)
        self.runner.ownership.release_idle = True  # held here but run by no task: give back
        self.runner.hand_off = self._hands_off
        self.runner.ensure_worker()
        while not self._stopping.is_set():
            try:
                await self._fire_ticks()
                claimed = await self._fill()
                backoff = 0.05
            except StoreError as exc:
                log.warning("worker %s: store unavailable (retrying in %.1fs): %s",
                            self.id, backoff, exc)
                await self._pause(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
                continue
            if not claimed:
                await self._idle()
        await self._drain()

    async def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a thread: store calls may block on the network."""
        return await asyncio.to_thread(fn, *args)

    async def _fire_ticks(self) -> None:
        """Fire the due schedule ticks when the next one is due, and at least every
        ``poll`` seconds (a schedule added meanwhile)."""
        now = self.engine.clock()
        if now < self._ticks_at:
            return
        self._ticks_at = now + self.poll
        try:
            nxt = await self._call(self.engine.schedules.fire_due)
        except (FsmError, ValueError) as exc:  # a store error, a stored row gone bad: the
            log.warning("worker %s: schedules not fired: %s", self.id, exc)  # claims go on
            return
        if nxt is not None and nxt > now:  # (still due: queued behind its last instance)
            self._ticks_at = min(self._ticks_at, nxt)

    async def _fill(self) -> bool:
        """Give orphans back, then claim up to the free slots; True when slots were filled."""
        if self._orphans:
            ids = sorted(self._orphans)
            await self._call(self.runner.ledger.release, self.id, ids)
            self._orphans.difference_update(ids)
        free = self.concurrency - len(self._running)
        if free <= 0:
            return False
        await self._refresh_limits()
        batch = await self._call(self._claim, self._load())
        for rec in batch:
            self._start(rec)
        return len(batch) == free

    async def _refresh_limits(self) -> None:
        """Read the fleet's stored limits when the last read is ``fleet.REFRESH_S`` old;
        an unreadable store keeps the previous ones (the claim then says why)."""
        if time.monotonic() - self._limits_at < fleet.REFRESH_S:
            return
        self._limits_at = time.monotonic()
        limits = await self._call(fleet.read, self.runner.store)
        if limits is None or limits == self.limits:
            return
        if self.limits is not None or not limits.empty:
            log.info("worker %s: fleet limits %s", self.id, limits.to_json() or "none")
        self.limits = limits
        self.plan = self.own_plan.tightened(limits)
        self.runner.use_limits(limits)

    def _load(self) -> Counter[str]:
        """How many instances of each queue run here now."""
        return Counter(self._queue.get(iid, "default") for iid in self._running)

    def _claim(self, running: Counter[str]) -> list[InstanceRecord]:
        """One claim per limited queue with free slots here, one for the rest."""
        out: list[InstanceRecord] = []
        free = self.plan.total - sum(running.values())
        now = self.engine.clock()  # (before the claims: a row due after it is in next_due's)
        for c in self.plan.claims(running):
            limit = min(c.limit, free - len(out))
            if limit <= 0:
                break
            out += self.runner.ownership.claim(
                limit, machines=self.machines, queues=c.queues, skip_queues=c.skip,
                queue_limit=c.queue_limit, partition_limit=self.plan.partition_limit)
        if len(out) < free and (now >= self._due_read_at or (
                self._due_at is not None and now >= self._due_at)):
            # going idle: wake when the next timer or delayed start is due (read at most once
            # a poll, and when the last one read came: one indexed query, issue 38)
            self._due_at = self.runner.store.next_due(now, self.machines)
            self._due_read_at = now + self.poll
        return out

    def _hands_off(self, before: InstanceRecord, after: InstanceRecord) -> bool:
        """``Driver.hand_off``: give ``after`` back when its new queue is not for this
        worker now (else count it in that queue from here on)."""
        # how many run here per queue matters only for a queue with a limit here
        load = self._load() if after.queue in self.plan.per_queue else Counter()
        if self.plan.hands_off(after.queue, load):
            return True
        self._queue[after.id] = after.queue
        return False

    def _start(self, rec: InstanceRecord) -> None:
        # claimed again while a task here still runs it (this worker's lease lapsed, e.g.
        # a starved loop): that task's next commit is stale; this one goes on after it
        before = self._running.get(rec.id)
        # a claim made while a run of it broke off (a fill's claim runs in a thread): the
        # new claim is not that run's orphan to give back (matrix finding A2)
        self._orphans.discard(rec.id)
        task = asyncio.ensure_future(self._one(rec, before))
        self._running[rec.id] = task
        self._queue[rec.id] = rec.queue
        self.runner.scheduled(1)  # counted for group commit before it starts
        task.add_done_callback(functools.partial(self._done, rec.id))

    def _done(self, instance_id: str, task: asyncio.Task[None]) -> None:
        self.runner.ownership.started(instance_id)  # e.g. ended before it ran a step
        self.runner.scheduled(-1)
        if self._running.get(instance_id) is task:
            self._running.pop(instance_id, None)
            self._queue.pop(instance_id, None)
        if self._wake is not None:
            self._wake.set()

    async def _one(self, rec: InstanceRecord, before: asyncio.Task[None] | None = None) -> None:
        runner = self.runner
        if before is not None and not before.done():
            await asyncio.wait({before})
        try:
            runner.runnable(rec)
        except FsmError as exc:
            await self._park(rec, exc)
            return
        runner.take(rec)
        try:
            await runner.run(rec.id, self._count, family=False)
        except StaleWrite:
            pass  # taken over or cancelled meanwhile: its new owner goes on
        except StoreError as exc:
            log.warning("instance %s: store error, giving it back: %s", rec.id, exc)
            self._orphans.add(rec.id)
        except FsmError as exc:
            log.warning("instance %s stopped: %s", rec.id, exc)
        except Exception as exc:  # noqa: BLE001 - never keep an instance nobody runs
            log.exception("instance %s: unexpected %s, giving it back", rec.id,
                          type(exc).__name__)
            self._orphans.add(rec.id)

    def _count(self, rec: InstanceRecord) -> None:
        """``on_step``: a step this worker committed; counts the instances it ended (one
        another worker finished after taking it over is not this worker's)."""
        if rec.final:
            self.completed += 1

    async def _park(self, rec: InstanceRecord, exc: FsmError) -> None:
        """Leave an instance this worker cannot run, saying why (``fsm list``/``show``)."""
        step = self.runner.parking(rec, exc)
        if rec.id not in self._parked:
            self._parked.add(rec.id)
            log.warning("instance %s left alone: %s", rec.id, exc)
        try:
            if step is None or not (await self._call(self.runner.ledger.apply, [step]))[0]:
                await self._call(self.runner.ledger.release, self.id, [rec.id])
        except StoreError:
            self._orphans.add(rec.id)

    async def _idle(self) -> None:
        """Until new work may be there: a notification, a free slot, the poll, or stop."""
        assert self._wake is not None and self._stopping is not None
        self._wake.clear()
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.ensure_future(
                self._call(self.runner.store.wait_for_work, self.poll))
        waits: set[asyncio.Future[Any]] = {self._waiter, asyncio.ensure_future(self._wake.wait()),
                 asyncio.ensure_future(self._stopping.wait())}
        now = self.engine.clock()
        timeout = min(self.poll, max(0.0, self._ticks_at - now))
        if self._due_at is not None and self._due_at > now:  # (one past was claimed or
            timeout = min(timeout, self._due_at - now)        # waits for a free slot)
        done, pending = await asyncio.wait(waits, timeout=timeout,
                                           return_when=asyncio.FIRST_COMPLETED)
        for fut in pending:
            if fut is not self._waiter:
                fut.cancel()

    async def _pause(self, seconds: float) -> None:
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    async def _drain(self) -> None:
        """Let in-flight instances finish for ``grace`` seconds, cancel the rest, give every
        instance still held back (others may claim them at once) and deregister."""
        tasks = list(self._running.values())
        if tasks:
            log.info("worker %s draining %d instance(s)", self.id, len(tasks))
            _, late = await asyncio.wait(tasks, timeout=self.grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5.0)
        self.runner.ownership.stop_heartbeat()
        for _ in range(3):
            try:
                await self._call(self.runner.ledger.release, self.id)
                break
            except StoreError as exc:
                log.warning("worker %s: release failed: %s", self.id, exc)
                await asyncio.sleep(0.5)
        if self._waiter is not None and not self._waiter.done():
            await asyncio.wait({self._waiter}, timeout=self.poll + 1)
