"""Worker identity and liveness: who holds an instance, and whether it is still alive.

A worker is one engine in one process.  It registers a row and renews its
``heartbeat_at`` and ``lease_until`` every ``lease_seconds / 3``; an instance's
``owner`` is a worker id.  An owner is dead when its row is gone, when its
lease has expired, or (same host only) when its pid no longer
runs or now belongs to another process (compared by start time), so a
SIGKILLed local runner is detected at once without waiting out the lease.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

from ...process import pid_start
from ...store.records import WorkerRow

__all__ = ["is_alive", "live_ids", "new_worker", "pid_alive", "pid_start"]


def new_worker(now: float | None = None) -> WorkerRow:
    """A row describing this process as a fresh worker."""
    now = time.time() if now is None else now
    pid = os.getpid()
    return WorkerRow(id=f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}",
                     host=socket.gethostname(), pid=pid, pid_start=pid_start(pid),
                     started_at=now, heartbeat_at=now)


def pid_alive(worker: WorkerRow) -> bool:
    """False only when ``worker`` ran on this host and its process is gone (or its pid
    now belongs to another process); True for another host's worker."""
    if worker.host != socket.gethostname():
        return True
    return bool(worker.pid_start) and pid_start(worker.pid) == worker.pid_start


def is_alive(worker: WorkerRow, now: float, lease_seconds: float) -> bool:
    """True while ``worker`` may still be running its instances: its lease
    (``lease_until``, else ``heartbeat_at + lease_seconds``) holds and, on this
    host, its process still runs."""
    until = worker.lease_until if worker.lease_until is not None else (
        worker.heartbeat_at + lease_seconds)
    if now > until:
        return False
    if worker.host == socket.gethostname():
        return bool(worker.pid_start) and pid_start(worker.pid) == worker.pid_start
    return True


def live_ids(workers: list[WorkerRow], now: float, lease_seconds: float) -> set[str]:
    """Ids of the workers still alive."""
    return {w.id for w in workers if is_alive(w, now, lease_seconds)}
