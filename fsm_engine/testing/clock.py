"""A virtual clock for tests: retries, timeouts, deadlines and SLAs in milliseconds.

``VirtualClock`` runs coroutines on an event loop whose time is virtual and
skips ahead, like Temporal's time-skipping test server: whenever every task is
blocked on a timer (``asyncio.sleep``, ``wait_for``, ``asyncio.wait(timeout=)``,
``loop.call_later``) and nothing else can happen, the loop's time jumps to the
next timer at once.  The engine's epoch clock (``Engine(clock=vc.now)``) reads
the same virtual time, so a retry's 30 s backoff, a state's 10 s timeout, an
instance deadline, a review's 1 h SLA, a rate-limit window and the in-process
lease renewals all pass instantly, in order, deterministically (``seed`` seeds
the retry jitter through ``Engine(seed=…)``)::

    vc = VirtualClock()
    engine = vc.engine(tmp_path / "fsm.db", llm=scripted)
    iid = engine.start(machine, {"text": "hi"})
    rec = vc.run(engine.run(iid))          # or run_many / resume
    vc.advance(3600)                       # a review's SLA passes ...
    rec = vc.run(engine.run(iid))          # ... and its timer fires

Nothing changes on the real clock's path: the engine waits with plain
``asyncio`` calls, which this loop alone makes virtual.

Limits (where real time still passes):

* a **sync action's thread** (and any ``to_thread`` / ``run_in_executor`` call,
  e.g. a PostgreSQL store's group commit): while one runs, the loop waits for it
  in real time and virtual time follows real time, so a sync action's ``timeout``
  still means real seconds; an ``async`` (or ``inline``) action never holds time;
* **real network I/O** (a model behind HTTP, a webhook): while a socket other than
  the loop's own is registered, time also follows real time; use the scripted
  provider (``fsm_engine.llm.scripted``), whose ``delay_s`` is virtual;
* one process, one loop: ``fsm worker`` processes and other processes' leases use
  real time (the engine's own writes, claims and releases included, stamp its clock:
  ``runtime.ledger``);
* ``duration_ms`` in history rows is measured with ``time.perf_counter``: real;
* a long wait *inside* a run renews the engine's lease every ``lease_seconds / 3`` of
  virtual time (a store write each, ~0.3 ms: an hour ≈ 0.4 s real); between runs,
  ``advance`` jumps at the cost of one renewal.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar, TypeVarTuple, Unpack

from ..runtime import threads

__all__ = ["VirtualClock"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: The longest real wait (seconds) while real work outside the loop holds time.
_REAL_SLICE = 0.05


class _SkippingSelector(selectors.DefaultSelector):
    """A selector that, instead of blocking until the next timer, advances the clock."""

    clock: VirtualClock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        clock = self.clock
        if clock.held or len(self.get_map()) > 1:  # a thread or a socket: wait for real
            started = time.monotonic()
            ready = super().select(_REAL_SLICE if timeout is None else min(timeout, _REAL_SLICE))
            clock.offset += time.monotonic() - started
            return ready
        if timeout is None:  # no timer at all: only another thread can wake us
            return super().select(None)
        clock.offset += timeout
        return []


class _VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is ``VirtualClock.offset``."""

    def __init__(self, clock: VirtualClock) -> None:
        selector = _SkippingSelector()
        selector.clock = clock
        super().__init__(selector)
        self.fsm_clock = clock

    def time(self) -> float:
        return self.fsm_clock.offset

    def run_in_executor(self, executor: Executor | None, func: Callable[[Unpack[Ts]], T],
                        *args: *Ts) -> asyncio.Future[T]:
        fut = super().run_in_executor(executor, func, *args)
        self.fsm_clock.hold(fut)
        return fut


class VirtualClock:
    """Virtual time for the engine and its waits (one process, one loop at a time).

    Args:
        start: the epoch seconds ``now()`` returns before any time passed
            (default 1,700,000,000.0: 2023-11-14, fixed so runs repeat exactly).
        seed: the seed ``engine()`` gives ``Engine(seed=…)`` (retry jitter).
    """

    def __init__(self, start: float = 1_700_000_000.0, seed: int = 0) -> None:
        self.start = float(start)
        self.seed = seed
        #: Virtual seconds passed (the loop's ``time()``).
        self.offset = 0.0
        #: Real work outside the loop in flight (threads): while > 0 time follows real time.
        self.held = 0
        self._engines: list[Any] = []
        #: Called after each firing of the due ticks (``advance``), e.g. to pause a
        #: schedule after its last wanted tick (the test kit's schedule cases).
        self.after_ticks: Callable[[], None] | None = None

    def now(self) -> float:
        """Virtual epoch seconds (``Engine(clock=vc.now)``)."""
        return self.start + self.offset

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` (≥ 0), e.g. past a review's SLA
        between runs; the engines made by ``engine()`` renew their leases, as their
        heartbeats would have, and the schedule ticks that fall due on the way fire at once,
        in order (``Engine.schedules``, each at its own time).  Raises ``ValueError`` for a
        negative amount."""
        if seconds < 0:
            raise ValueError("virtual time only moves forward")
        target = self.offset + seconds
        self._fire_ticks(self.start + target)
        self._renew(target - self.offset)
        self.offset = target

    def _renew(self, seconds: float) -> None:
        """Renew the leases of the engines made here, as their heartbeats would have over
        the next ``seconds``: one renewal, long enough to cover the jump."""
        for engine in self._engines:
            own = engine.ownership
            if own.registered:
                lease, own.lease_seconds = own.lease_seconds, own.lease_seconds + seconds
                try:
                    own.renew()
                finally:
                    own.lease_seconds = lease

    def _fire_ticks(self, until: float) -> None:
        """Fire, in order, every schedule tick due by ``until`` of the engines made here
        that use schedules (``Engine.schedules``), moving time to each tick first: a jump
        is time passing, not downtime (no tick is lost to ``catchup``).  A tick left due
        (queued behind its schedule's last instance) is tried again at each later tick."""
        users = [e for e in self._engines if e._schedules is not None]
        while users:
            now = self.now()
            for engine in users:
                engine.schedules.fire_due()
            if self.after_ticks is not None:
                self.after_ticks()
            upcoming = [r.next_fire for e in users for r in e.store.schedules()
                        if not r.paused and r.next_fire > now]
            if not upcoming or min(upcoming) > until:
                return
            self._renew(min(upcoming) - now)  # the engines' leases live through the jump
            self.offset = min(upcoming) - self.start

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep`` on the virtual loop (returns at once in real time)."""
        await asyncio.sleep(seconds)

    def hold(self, fut: asyncio.Future[Any]) -> None:
        """Count ``fut`` (work in a thread) as holding time until it is done."""
        self.held += 1
        fut.add_done_callback(self._release)

    def _release(self, fut: asyncio.Future[Any]) -> None:
        self.held -= 1

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to its end on a fresh virtual loop; return its result."""
        loop = _VirtualLoop(self)
        previous, threads.HOLD = threads.HOLD, self.hold
        try:
            return loop.run_until_complete(coro)
        finally:
            threads.HOLD = previous
            try:
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def engine(self, store: Any = "fsm.db", **kwargs: Any) -> Any:
        """An ``Engine`` on ``store`` reading this clock (``clock=``, ``seed=`` set; its
        lease renewed on virtual time)."""
        from ..runtime.engine import Engine
        kwargs.setdefault("seed", self.seed)
        engine = Engine(str(store) if isinstance(store, Path) else store, clock=self.now,
                        **kwargs)
        engine.ownership.renew_on_loop = True
        self._engines.append(engine)
        return engine


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is still running on ``loop`` (heartbeats, abandoned waits) and let it
    finish, as ``asyncio.run`` does."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
