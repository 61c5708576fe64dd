"""What every fleet of real ``fsm worker`` processes in the tests shares: each process logs
to its own file under ``folder``; ``stop`` ends them all (``scale_harness.Fleet``,
``tick_fleet.Workers``)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


class WorkerProcs:
    """``procs``: the ``fsm worker`` processes started, in order; ``folder``: their logs."""

    folder: Path
    procs: list[subprocess.Popen[bytes]]

    def log(self, i: int) -> str:
        """The output of the ``i``-th process started."""
        return (self.folder / f"worker{i}.log").read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> list[int | None]:
        """SIGTERM every live worker (SIGCONT first: a stopped one must see it); their exit
        codes (None: had to be killed after ``timeout`` seconds)."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes
