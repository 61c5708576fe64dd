"""Child-process entry point for W1/W2: ``python -m bench.child``.

The parent keeps one child per peer and writes one JSON task per line on
its stdin (``bench.workloads.steps.Task`` fields); the child answers one
JSON line per task on stdout: ``{"samples": […]}`` or ``{"error": "…"}``.
The first time a (workload, peer, synchronous) task is seen it is preceded
by an untimed warm-up.  One process per peer keeps import side effects
(DBOS's global registry, LangGraph's caches) and memory apart, and lets
the parent interleave repetitions of different peers so that load from
other processes on the machine hits them all alike.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from .workloads.steps import Task, run_task


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:160]


def main() -> int:
    logging.basicConfig(level=logging.ERROR)
    warmed: set[tuple[str, str, str]] = set()
    for line in sys.stdin:
        if not line.strip():
            continue
        task = Task.from_dict(json.loads(line))
        key = (task.workload, task.peer, task.synchronous)
        try:
            samples = [s.as_dict() for s in run_task(task, warm=key not in warmed)]
            warmed.add(key)
            out = {"samples": samples}
        except Exception as exc:  # noqa: BLE001 - reported as "n/a (reason)"
            traceback.print_exc(file=sys.stderr)
            out = {"error": _short(exc)}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
