"""This process as the fleet and the store name it: its pid and the kernel's start time
of that pid, which together tell one process from a later one given the same pid."""

from __future__ import annotations

import os


def pid_start(pid: int) -> str:
    """The kernel's start time of a running ``pid`` (``/proc/PID/stat`` field 22, clock
    ticks since boot), or ``""`` when there is no such process or it is a zombie (killed,
    not yet reaped: dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode(errors="replace")
    except OSError:
        return ""
    fields = data.rsplit(")", 1)[-1].split()
    return "" if fields[0] in ("Z", "X") else fields[19]


def session_name(pid: int | None = None) -> str:
    """The ``application_name`` of this process's database sessions,
    ``fsm_engine:PID:START`` (``START``: ``pid_start``), the name a worker's row maps to
    (``store.pg_fence``); at most 40 characters (PostgreSQL keeps 63)."""
    pid = os.getpid() if pid is None else pid
    return f"fsm_engine:{pid}:{pid_start(pid)}"
