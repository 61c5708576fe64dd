"""Child-process entry point: ``python -m bench.child '<json>'``.

The JSON is a list of W1/W2 task dicts (see ``bench.workloads.steps.Task``)
for one peer.  One JSON line is printed per task on stdout: ``{"task": …,
"samples": […]}`` or ``{"task": …, "error": "…"}``; a failing task does not
stop the next.  Running each peer in its own process keeps import side
effects (DBOS's global registry, LangGraph's caches) and memory apart.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from dataclasses import asdict

from .workloads.steps import Task, run_task


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:200]


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.ERROR)
    for data in json.loads(argv[0]):
        task = Task.from_dict(data)
        try:
            samples = [s.as_dict() for s in run_task(task)]
            out = {"task": asdict(task), "samples": samples}
        except Exception as exc:  # noqa: BLE001 - reported as "n/a (reason)"
            traceback.print_exc(file=sys.stderr)
            out = {"task": asdict(task), "error": _short(exc)}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
