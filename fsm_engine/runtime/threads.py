"""Worker threads for sync actions, with wake-ups batched in both directions.

A plain ``def`` action may block (a sync HTTP client, a file read), so it runs
off the event loop.  ``concurrent.futures.ThreadPoolExecutor`` with
``run_in_executor`` pays two thread wake-ups per call (a futex to wake a
worker, a self-pipe write to wake the loop) plus future chaining: about
100 µs a call on a 2-core VM, and with thousands of instances in flight the
wake-ups, not the actions, fill the CPU.  ``ActionThreads`` keeps the
one-call-per-thread isolation (a slow call holds only its own thread) but:

- calls submitted in one event-loop iteration reach the workers with one lock
  acquisition and one notify; a worker that takes a call while more are
  queued wakes one more idle worker (a cascade, so trivial calls are drained
  by the first thread awake while blocking calls spread over all threads
  within a few wake-ups);
- results finishing while the loop is busy come back with one
  ``call_soon_threadsafe`` for the lot.

Threads are daemons, started on demand up to ``max_threads``: a hung action
never blocks interpreter exit (its result is dropped when nobody waits).
"""

from __future__ import annotations

import _thread
import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]
_Result = tuple["asyncio.Future[Any]", Any, "BaseException | None"]


#: ``hold(future)``: told of each call handed to a thread while a virtual clock runs
#: (``fsm_engine.testing.VirtualClock``: time follows real time until it is done); None
#: otherwise, so the real clock's path pays one global read.
HOLD: Callable[[asyncio.Future[Any]], None] | None = None


class ActionThreads:
    """A pool of daemon threads running sync calls for asyncio code.

    Args:
        max_threads: most threads ever started (default 32); calls beyond
            that queue until a thread is free.
        name: thread name prefix.
    """

    def __init__(self, max_threads: int = 32, name: str = "fsm-action") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self.max_threads = max_threads
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._work: deque[_Call] = deque()
        self._threads = 0
        self._idle = 0
        self._closed = False
        self._outgoing: list[_Call] = []  # submitted this loop iteration (loop thread only)
        self._scheduled: asyncio.AbstractEventLoop | None = None  # loop with a _dispatch due
        self._done: dict[asyncio.AbstractEventLoop, list[_Result]] = {}
        self._done_lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in a worker thread; await the returned future for its result
        (or its exception).  Must be called from a running event loop; raises
        ``RuntimeError`` after ``shutdown``."""
        if self._closed:
            raise RuntimeError("action threads are shut down")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._scheduled is not loop:  # (a loop that closed with a dispatch due is replaced)
            self._scheduled = loop
            loop.call_soon(self._dispatch)
        self._outgoing.append((loop, fut, fn, args))
        if HOLD is not None:
            HOLD(fut)
        return fut

    def _dispatch(self) -> None:
        batch = [call for call in self._outgoing if not call[1].done()]  # skip cancelled
        self._outgoing, self._scheduled = [], None
        with self._cond:
            if self._closed or not batch:
                return
            self._work.extend(batch)
            self._wake_one()

    def _wake_one(self) -> None:
        """With ``_cond`` held: get one more thread onto the queue (an idle one, else a new one)."""
        if self._idle:
            self._cond.notify()
        elif self._threads < self.max_threads:
            self._threads += 1
            threading.Thread(target=self._worker, daemon=True,
                             name=f"{self.name}-{self._threads}").start()

    def _worker(self) -> None:
        while True:
            with self._cond:
                while not self._work:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                loop, fut, fn, args = self._work.popleft()
                if self._work:
                    self._wake_one()  # more queued: cascade to another thread
            if fut.done():  # cancelled while queued (read across threads: a hint, not a lock)
                continue
            try:
                result, exc = fn(*args), None
            except BaseException as err:  # noqa: BLE001 - handed to the awaiting step
                result, exc = None, err
            self._deliver(loop, (fut, result, exc))

    def _deliver(self, loop: asyncio.AbstractEventLoop, item: _Result) -> None:
        with self._done_lock:
            pending = self._done.setdefault(loop, [])
            pending.append(item)
            first = len(pending) == 1
        if first:
            try:
                loop.call_soon_threadsafe(self._drain, loop)
            except RuntimeError:  # the loop is closed: nobody waits for these results
                with self._done_lock:
                    self._done.pop(loop, None)

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._done_lock:
            results = self._done.pop(loop, [])
        for fut, result, exc in results:
            if fut.done():  # cancelled (a timeout, a cancelled instance)
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def shutdown(self) -> None:
        """Stop idle threads and drop queued calls; calls already running finish in
        their (daemon) threads and their results are dropped."""
        with self._cond:
            self._closed = True
            self._work.clear()
            self._cond.notify_all()
        self._outgoing.clear()


def in_own_thread(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any],
                  args: tuple[Any, ...]) -> asyncio.Future[Any]:
    """Run ``fn(*args)`` in a new daemon thread; its outcome lands in the returned future
    (dropped when the future was cancelled or the loop is gone).

    Started with ``_thread.start_new_thread``, which returns at once:
    ``threading.Thread.start`` waits until the new thread runs, and with other
    threads holding the GIL that wait was ~11 ms of a stalled loop per call
    (profiled under ``bench/scale_out.py``)."""
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    def work() -> None:
        try:
            result, exc = fn(*args), None
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting step
            result, exc = None, err
        try:
            loop.call_soon_threadsafe(settle, result, exc)
        except RuntimeError:  # the loop closed while this thread hung: nobody waits
            pass
    _thread.start_new_thread(work, ())  # never joined: like a daemon thread
    if HOLD is not None:
        HOLD(fut)
    return fut
