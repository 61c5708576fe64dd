"""The virtual clock (``fsm_engine.testing.VirtualClock``): how much faster than real time.

    python bench/virtual_clock.py [--n 20]

``n`` instances of each of the four paths of ``tests/helpers/clock_machine.py`` (retries with
15-30 s jittered backoffs, a 10 s timeout, a 1 h review SLA, a deadline) run to their
ends on the virtual clock, then the same machine scaled to small delays (x0.002, a
50 ms SLA) on the real clock.  Prints real seconds, virtual seconds and the ratio
virtual / real, and the real clock's real seconds: the ratios are what to compare
(the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from fsm_engine import Engine  # noqa: E402
from fsm_engine.llm.scripted import Scripted  # noqa: E402
from fsm_engine.testing import VirtualClock  # noqa: E402
from tests.helpers.clock_machine import build  # noqa: E402
from tests.testing.test_testkit_clock import MODES, REPLIES  # noqa: E402


def _round(engine: Any, machine: Any, n: int, run: Any, wait_sla: Any) -> None:
    ids = [engine.start(machine, {"mode": m}, deadline_s=machine.states[0].timeout
                        if m == "late" else None) for m in MODES for _ in range(n)]
    run(engine.run_many(ids))
    for item in engine.reviews():
        if engine.store.get(item.instance_id).input.get("mode") == "flaky":
            engine.decide(item, "approve", by="bench")
    wait_sla()
    run(engine.run_many(ids))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20, help="instances per path")
    n = parser.parse_args().n
    with tempfile.TemporaryDirectory() as tmp:
        vc = VirtualClock(seed=1)
        engine = vc.engine(f"{tmp}/v.db", llm=Scripted.from_replies(REPLIES), breaker=None)
        began = time.perf_counter()
        _round(engine, build(1.0), n, vc.run, lambda: vc.advance(3601))
        virtual_real = time.perf_counter() - began
        engine.close()
        real = Engine(f"{tmp}/r.db", llm=Scripted.from_replies(REPLIES), seed=1, breaker=None)
        began = time.perf_counter()
        _round(real, build(0.002, sla_s=0.05), n, asyncio.run, lambda: time.sleep(0.06))
        real_real = time.perf_counter() - began
        real.close()
    print(f"{4 * n} instances: virtual clock {virtual_real:.3f} s real for {vc.offset:.0f} s "
          f"virtual (x{vc.offset / virtual_real:,.0f}); real clock at x0.002 delays "
          f"{real_real:.3f} s")


if __name__ == "__main__":
    main()
