"""Subprocesses the tests start (servers: ``fsm ui``, ``llama_cpp.server``)."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM ``process`` and reap it; SIGKILL when it has not ended within 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
