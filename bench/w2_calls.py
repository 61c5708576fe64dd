"""Python calls per transition of fsm_engine in W1 or W2, deterministic (a profile hook).

``python -m bench.w2_calls [W1|W2] [N] [TOP] [PEER]`` builds the workload the way
``bench/peers/fsm.py`` does (``PEER``: ``BenchAsyncActions``, the ``fsm_engine`` row of
``bench/run.py``, by default; ``Bench``: plain ``def`` actions in worker threads;
``BenchInline``) on a fresh SQLite file (FULL), runs an untimed warm-up of 5
instances, then ``N`` instances (default 200) with a profile hook counting every call
the way cProfile does (a Python function's call or a coroutine's resumption, a
builtin's call; the totals run a few per cent above cProfile's ``total_calls``).  W2:
all in flight, ``s2`` sleeping 0.2 s; W1: one after another.  It prints the calls /
(N × transitions per instance) on the event loop's thread, in the engine's worker
threads (the sync actions and what wraps them; their count varies with how the
threads wake) and both, then the ``TOP`` (30) functions by calls per transition, one
``calls  file(function)`` line each.  Unlike CPU time it hardly depends on the
machine's load (group-commit batch sizes vary a little), so two trees can be compared
(``PYTHONPATH=<tree> python -m bench.w2_calls``, the file copied into an older tree)
and the per-function lines diffed to see where calls were added.  Calls are a proxy:
a call less is ~100-200 instructions; C-level work (allocation, ``zip(..., strict=)``,
pydantic) does not show here (``valgrind --tool=callgrind`` counts instructions).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
from collections import Counter
from types import FrameType
from typing import Any

from .common import TRANSITIONS, fresh_path
from .peers import fsm

_CALLS = {"call", "c_call"}


class Calls:
    """Counts calls per ``(thread kind, label)`` while ``on``; install with ``hook``."""

    def __init__(self) -> None:
        self.on = False
        self.main = threading.get_ident()
        self.counts: Counter[tuple[bool, str]] = Counter()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        """The ``sys.setprofile`` function."""
        if not self.on or event not in _CALLS:
            return
        if event == "c_call":
            label = getattr(arg, "__qualname__", repr(arg))
        else:
            code = frame.f_code
            label = f"{_path(code.co_filename)}({code.co_qualname})"
        self.counts[threading.get_ident() == self.main, label] += 1


def _path(path: str) -> str:
    marker = f"{os.sep}fsm_engine{os.sep}"
    return ("fsm_engine/" + path.split(marker, 1)[1]) if marker in path else os.path.basename(path)


async def _count(workload: str, n: int, workdir: str, peer: str) -> Calls:
    calls = Calls()
    threading.setprofile(calls.hook)  # the engine's worker threads, started from here on
    bench = getattr(fsm, peer)(fresh_path(workdir, f"calls-{workload}.db"), "FULL", 0.2)
    await bench.open(workload)
    run = bench.sequential if workload == "W1" else bench.concurrent
    await run(5)
    sys.setprofile(calls.hook)
    calls.on = True
    await run(n)
    calls.on = False
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    await bench.close()
    return calls


def main(workload: str = "W2", n: int = 200, top: int = 30,
         peer: str = "BenchAsyncActions") -> None:
    """Print calls per transition of ``workload`` over ``n`` instances of ``peer`` (a
    ``bench.peers.fsm`` class), then the ``top`` functions."""
    with tempfile.TemporaryDirectory() as workdir:
        calls = asyncio.run(_count(workload, n, workdir, peer))
    per = n * TRANSITIONS
    loop = sum(v for (main_thread, _), v in calls.counts.items() if main_thread)
    threads = sum(v for (main_thread, _), v in calls.counts.items() if not main_thread)
    print(f"{workload} {peer} {n} instances, calls per transition: {(loop + threads) / per:.1f} "
          f"(event loop {loop / per:.1f}, worker threads {threads / per:.1f})")
    for (main_thread, label), v in calls.counts.most_common(top):
        print(f"{v / per:8.2f}  {'' if main_thread else '[thread] '}{label}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "W2", int(args[1]) if len(args) > 1 else 200,
         int(args[2]) if len(args) > 2 else 30, args[3] if len(args) > 3 else "BenchAsyncActions")
