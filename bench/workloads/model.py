"""W4 real model: ``python -m bench.workloads.model WORKDIR REPS [--run-many]``.

The reference machine (``machines/moderation.py``) moderates three license
texts from ``/usr/share/common-licenses`` with the embedded model
(``fsm_engine.llm.LocalLlama``, Gemma 3 270M).  The provider is wrapped so
every ``complete`` call is timed; the share of wall time inside the model
is the length of the union of the call intervals (calls queue on the
model's single worker thread, so they may overlap) over the wall time of
the run.  The model is loaded before timing starts.  The instances run one
after another; with ``--run-many`` also all three at once (what ``fsm run``
does).  Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LICENSES = Path("/usr/share/common-licenses")


class TimedProvider:
    """Wraps a provider and records the (start, end) of every ``complete``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.model = inner.name, inner.model
        self.intervals: list[tuple[float, float]] = []

    async def complete(self, messages: list[dict[str, str]], **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.inner.complete(messages, **kwargs)
        finally:
            self.intervals.append((started, time.perf_counter()))

    async def aclose(self) -> None:
        return None


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


async def _one_run(llm: Any, workdir: str, files: list[str], concurrent: bool) -> dict[str, Any]:
    from fsm_engine import Engine, SqliteStore

    from ..common import fresh_path
    timed = TimedProvider(llm)
    engine = Engine(SqliteStore(fresh_path(workdir, "w4.db")), llm=timed)
    module = str(ROOT / "machines" / "moderation.py")
    ids = [engine.start(module, {"path": f}) for f in files]
    started = time.perf_counter()
    if concurrent:
        records = await engine.run_many(ids)
    else:
        records = [await engine.run(i) for i in ids]
    wall = time.perf_counter() - started
    await engine.aclose()
    return {"wall_s": wall, "model_s": union_seconds(timed.intervals),
            "calls": len(timed.intervals),
            "sources": [getattr(r, "context", {}).get("verdict_source") for r in records],
            "statuses": [getattr(r, "status", repr(r)) for r in records]}


async def _main(workdir: str, reps: int, run_many: bool) -> dict[str, Any]:
    from fsm_engine.llm.local import LocalLlama
    os.environ.setdefault("FSM_NOTIFY_FILE", os.path.join(workdir, "w4-notify.jsonl"))
    os.environ.pop("FSM_NOTIFY_URL", None)
    files = sorted(str(p) for p in LICENSES.iterdir() if p.is_file())[:3]
    llm = LocalLlama()
    await llm.load()
    out: dict[str, Any] = {"files": [os.path.basename(f) for f in files],
                           "load_s": llm.load_seconds, "run_many": [], "sequential": []}
    for _ in range(reps):
        out["sequential"].append(await _one_run(llm, workdir, files, concurrent=False))
        if run_many:
            out["run_many"].append(await _one_run(llm, workdir, files, concurrent=True))
    await llm.aclose()
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(json.dumps(asyncio.run(_main(sys.argv[1], int(sys.argv[2]), "--run-many" in sys.argv))))
