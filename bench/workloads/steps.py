"""W1 (durable step overhead) and W2 (concurrency), run inside a child process.

A ``Session`` is one repetition of one workload on one peer with one
``synchronous`` level, on a fresh database: ``open`` (untimed set-up),
one or more ``run(n)`` calls (timed; W1 runs instances in chunks so the
parent can interleave peers finely), ``close`` (untimed tear-down, returns
the sample).  The first session of a (workload, peer, synchronous) case in a
process is preceded by an untimed warm-up of ``WARMUP`` instances (lazy
imports and caches).  Creating instances is inside the timed region.  Each
``run`` also measures the process's CPU time (``time.process_time()``: every
thread of the child, so a peer's worker threads count too).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import time
from dataclasses import dataclass

from ..common import (
    TRANSITIONS,
    Sample,
    db_bytes,
    doc_text,
    fresh_path,
    peak_rss_mib,
    reset_peak_rss,
)

WARMUP = 5


@dataclass(frozen=True)
class Task:
    """One case: ``workload`` (``W1``/``W2``) of ``peer`` (``module:Class``) at ``synchronous``."""

    workload: str
    peer: str
    synchronous: str
    workdir: str
    sleep: float = 0.2
    doc: int = 0  # W1 at a context size: characters of an unchanged ``doc`` field (0: none)

    @property
    def tag(self) -> str:
        return (f"{self.workload}-{self.peer.rsplit('.', 1)[-1].replace(':', '-')}-"
                f"{self.synchronous}-{self.doc}")


def load_peer(ref: str) -> type:
    """The ``Bench`` class named ``module:Class``."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


class Session:
    """One measured repetition; drive with ``await open()``, ``await run(n)`` …, ``await close()``."""

    def __init__(self, task: Task, path: str) -> None:
        self.task, self.path = task, path
        self.seconds, self.instances, self.cpu = 0.0, 0, 0.0
        self.extra: dict[str, float] = {}

    async def open(self) -> None:
        self.bench = load_peer(self.task.peer)(self.path, self.task.synchronous, self.task.sleep)
        if self.task.doc:
            if not hasattr(self.bench, "doc"):
                raise RuntimeError("this peer does not run W1 at a context size")
            self.bench.doc = doc_text(self.task.doc)
        await self.bench.open(self.task.workload)
        gc.collect()
        reset_peak_rss()

    async def run(self, n: int) -> float:
        """Run ``n`` more instances; return the seconds they took."""
        started, cpu = time.perf_counter(), time.process_time()
        try:
            extra = (await self.bench.sequential(n) if self.task.workload == "W1"
                     else await self.bench.concurrent(n)) or {}
        except BaseException:
            with contextlib.suppress(Exception):
                await self.bench.close()
            raise
        seconds = time.perf_counter() - started
        self.cpu += time.process_time() - cpu
        self.seconds += seconds
        self.instances += n
        for key, value in extra.items():
            self.extra[key] = self.extra.get(key, 0.0) + value
        return seconds

    async def close(self) -> Sample:
        rss = peak_rss_mib()
        await self.bench.close()
        return Sample(seconds=self.seconds, transitions=self.instances * TRANSITIONS,
                      rss_mib=rss, db_bytes=db_bytes(self.path),
                      extra={**self.extra, "cpu_seconds": self.cpu})


async def warm_up(task: Task) -> None:
    """An untimed session of ``WARMUP`` instances on its own database."""
    session = Session(task, fresh_path(task.workdir, f"{task.tag}-warm.db"))
    await session.open()
    await session.run(WARMUP)
    await session.close()
