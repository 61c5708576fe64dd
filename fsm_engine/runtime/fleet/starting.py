"""Instances claimed here whose task has not started yet (issue 36).

A worker's claim runs in a thread; the instances it took start running when the event
loop next gets to them.  Until then no task runs them, yet they are not idle: the
heartbeat (``Ownership.check``, in its own thread) must not give them back, or another
worker runs the step while this one runs it too (found under load: matrix cells ran a
step twice with no takeover).  An entry ends when its task starts or ends
(``Ownership.started``), or ``ttl`` seconds after its claim — past that the loop has
been starved longer than a lease (the renewal thread stops renewing then, so other
workers may take the instance over anyway, with a ``recovery`` row), and the entry of a
claim nobody ran (a bug elsewhere) cannot pin an instance for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable


class Starting:
    """A thread-safe set of instance ids with their claim time (``time.monotonic``, s)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._at: dict[str, float] = {}
        self._lock = threading.Lock()

    def claimed(self, ids: Iterable[str]) -> None:
        """``ids`` were just claimed here; their tasks have not started."""
        now = time.monotonic()
        with self._lock:
            self._at.update((iid, now) for iid in ids)

    def started(self, iid: str) -> None:
        """A task here runs (or ran) ``iid``: it is judged by the tasks from now on."""
        with self._lock:
            self._at.pop(iid, None)

    def current(self) -> set[str]:
        """The ids claimed less than ``ttl`` seconds ago whose task has not started."""
        now = time.monotonic()
        with self._lock:
            for iid in [i for i, at in self._at.items() if now - at > self.ttl]:
                del self._at[iid]
            return set(self._at)
