"""W1 (durable step overhead) and W2 (concurrency), run inside a child process.

A *task* is one workload on one peer with one ``synchronous`` level; it
runs ``reps`` times, each on a fresh database, after one small untimed
warm-up (lazy imports and caches), and yields one ``Sample`` per repetition.
Setup and teardown (opening the store, compiling graphs, launching DBOS)
are outside the timed region; creating instances is inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import time
from dataclasses import dataclass
from typing import Any

from ..common import TRANSITIONS, Sample, db_bytes, fresh_path, peak_rss_mib, reset_peak_rss

WARMUP = 5


@dataclass(frozen=True)
class Task:
    """What a child runs: ``workload`` (``W1``/``W2``) of ``peer`` (``module:Class``)."""

    workload: str
    peer: str
    synchronous: str
    n: int
    reps: int
    workdir: str
    sleep: float = 0.2

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Task":
        return cls(**data)


def load_peer(ref: str) -> type:
    """The ``Bench`` class named ``module:Class``."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


async def _once(cls: type, task: Task, path: str, n: int) -> Sample:
    bench = cls(path, task.synchronous, task.sleep)
    await bench.open(task.workload)
    gc.collect()
    reset_peak_rss()
    started = time.perf_counter()
    try:
        extra = (await bench.sequential(n) if task.workload == "W1"
                 else await bench.concurrent(n)) or {}
    except BaseException:
        with contextlib.suppress(Exception):
            await bench.close()
        raise
    seconds = time.perf_counter() - started
    rss = peak_rss_mib()
    await bench.close()
    return Sample(seconds=seconds, transitions=n * TRANSITIONS, rss_mib=rss,
                  db_bytes=db_bytes(path), extra=dict(extra))


def run_task(task: Task, warm: bool = True) -> list[Sample]:
    """Optionally warm up once, then run ``task.reps`` measured repetitions.

    Raises whatever the peer raised (import errors included).
    """
    cls = load_peer(task.peer)
    tag = f"{task.workload}-{task.peer.rsplit('.', 1)[-1].replace(':', '-')}-{task.synchronous}"
    if warm:
        asyncio.run(_once(cls, task, fresh_path(task.workdir, f"{tag}-warm.db"), WARMUP))
    samples = []
    for _ in range(task.reps):
        path = fresh_path(task.workdir, f"{tag}.db")
        samples.append(asyncio.run(_once(cls, task, path, task.n)))
    return samples
