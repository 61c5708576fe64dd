"""Subprocesses the tests start (servers: ``fsm ui``, ``llama_cpp.server``), and waiting
on what they do."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def stop(process: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM ``process`` and reap it; SIGKILL when it has not ended within 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (``/proc/PID/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stopped(proc: subprocess.Popen) -> bool:  # type: ignore[type-arg]
    """True when ``proc`` sits stopped (SIGSTOP): every thread of it in state ``T``
    (``/proc/PID/task/TID/stat``).  The process's own ``stat`` shows its main thread only,
    which stops first when it signals itself: another thread (a write in a thread of the
    store) may run on for a moment, and take a lock the test then finds held."""
    states = []
    try:
        tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
    except FileNotFoundError:
        return False
    for task in tasks:
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # (a thread that ended meanwhile)
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.1) -> None:
    """Poll ``predicate`` until true; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
