"""Real ``fsm worker`` processes firing one schedule (``tests/runtime/fleet/
test_schedule_fleet.py``, ``bench/schedules.py``): spawn them, add the schedule, and read
the books — which ticks have their instance, against the ticks the schedule had."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from worker_procs import WorkerProcs

ROOT = Path(__file__).resolve().parents[2]
#: ``fsm`` as a real process (the interpreter running the tests, this tree on its path).
FSM = [sys.executable, "-m", "fsm_engine.cli"]
TICKED = str(ROOT / "tests" / "helpers" / "tick_machine.py")


class Workers(WorkerProcs):
    """``fsm worker`` processes on one store, each logging to its own file."""

    def __init__(self, url: str, folder: Path, *, poll: float = 0.2, lease: float = 1.0) -> None:
        self.url, self.folder = url, folder
        self.argv = [*FSM, "worker", "--db", url, "--lease", str(lease), "--poll", str(poll),
                     "--grace", "5"]
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, n: int = 1, env: dict[str, str] | None = None) -> None:
        for _ in range(n):
            log = open(self.folder / f"worker{len(self.procs)}.log", "wb")
            self.procs.append(subprocess.Popen(
                self.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                env=dict(os.environ, FSM_MACHINES_ROOT=str(ROOT), PYTHONUNBUFFERED="1",
                         **(env or {}))))


def add(url: str, name: str, *, every: str = "1s", catchup: str = "all",
        overlap: str = "allow", machine: str = TICKED) -> Any:
    """Store the schedule (module references relative to ``ROOT``); its row."""
    from fsm_engine import Engine
    before = os.environ.get("FSM_MACHINES_ROOT")  # set for this call only: never leaked to
    os.environ["FSM_MACHINES_ROOT"] = str(ROOT)  # the later tests of the process
    engine = Engine(url)
    try:
        return engine.schedules.add(name, machine, every=every, catchup=catchup,
                                    overlap=overlap)
    finally:
        engine.close()
        if before is None:
            os.environ.pop("FSM_MACHINES_ROOT", None)
        else:
            os.environ["FSM_MACHINES_ROOT"] = before


def books(store: Any, name: str, first: float) -> tuple[list[str], list[str]]:
    """(the ids of the schedule's instances, the ids its ticks from ``first`` to its last
    fired tick should have: one each), both sorted."""
    from fsm_engine.runtime.schedule_spec import tick_id, ticks
    row = store.get_schedule(name)
    have = sorted(r.id for r in store.list() if r.id.startswith(f"{name}-"))
    if row is None or row.last_fire is None:
        return have, []
    return have, [tick_id(name, t) for t in ticks(row, first, row.last_fire, 100_000)]
