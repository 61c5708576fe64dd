"""A ``Worker`` serving on an event loop of its own, in a thread (``Background``:
the test can block that loop), and ``until``, polling a predicate every 20 ms
(``AssertionError`` naming ``what`` after ``timeout`` s)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from fsm_engine.runtime.worker import Worker


def until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


class Background:
    """A ``Worker`` serving on its own event loop in a thread."""

    def __init__(self, engine: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.worker = Worker(engine, concurrency=8, poll=0.05)
        self.thread = threading.Thread(target=self.loop.run_until_complete,
                                       args=(self.worker.serve(),), daemon=True)
        self.thread.start()

    def block(self) -> threading.Event:
        """Block the loop until the returned event is set."""
        resume = threading.Event()
        self.loop.call_soon_threadsafe(resume.wait, 60)
        return resume

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.worker.stop)
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.loop.run_until_complete(asyncio.sleep(0))  # the heartbeat task's cancellation
        self.loop.close()
