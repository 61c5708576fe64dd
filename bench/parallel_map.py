"""A Map of N branches (default 1,000), each one scripted model call of 0.2 s: wall time as a
ratio of the ideal (issue 14's target is ≤ 2×; reported, never asserted).

The ideal is the calls' own time at the Map's ``max_concurrency``:
``ceil(N / concurrency) × delay``.  Measured from ``Engine.run`` of the parent (the
children are created in the parent's transaction, run, joined) on SQLite; the best of
``--repeat`` runs (other work on a shared machine only ever adds time), with the CPU
seconds the run used (wall ≈ ideal + the CPU that cannot overlap the calls).

    python bench/parallel_map.py [--n 1000] [--delay 0.2] [--concurrency 1000 250 50]
                                 [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel  # noqa: E402

from fsm_engine import Engine, Machine, Map, State, Step, Transition  # noqa: E402
from fsm_engine.llm import Scripted  # noqa: E402


class Part(BaseModel):
    n: int
    said: str = ""


async def call(ctx: Part, step: Step) -> dict:
    out = await step.llm.complete([{"role": "user", "content": str(ctx.n)}], max_tokens=4)
    return {"said": out.text}


part = Machine(name="bench-part", context=Part, initial="call", states=[
    State("call", action=call), State("done", final=True)],
    transitions=[Transition("ok", "call", "done")])


class Job(BaseModel):
    ns: list[int] = []
    parts: list = []


def parent(concurrency: int) -> Machine:
    return Machine(name=f"bench-map-{concurrency}", context=Job, initial="map", states=[
        State("map", fan_out=Map(items="ns", machine=part, item_field="n", into="parts",
                                 max_concurrency=concurrency)),
        State("done", final=True)], transitions=[Transition("joined", "map", "done")])


def measure(n: int, delay: float, concurrency: int, folder: str,
            run: int = 0) -> tuple[float, float, float]:
    """(wall s, CPU s, ideal s) of one Map of ``n`` at ``concurrency``."""
    llm = Scripted.from_replies([{"text": "ok", "prompt_tokens": 2, "completion_tokens": 1,
                                  "delay_s": delay}])
    engine = Engine(os.path.join(folder, f"map{concurrency}-{run}.db"), llm=llm)
    iid = engine.start(parent(concurrency), {"ns": list(range(n))})
    started, cpu = time.perf_counter(), time.process_time()
    rec = asyncio.run(engine.run(iid))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert rec.status == "completed" and len(rec.context["parts"]) == n, rec.reason
    assert rec.tokens_used == 3 * n
    engine.close()
    return wall, cpu, math.ceil(n / concurrency) * delay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--delay", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1000, 250, 50])
    ap.add_argument("--repeat", type=int, default=3, help="runs per concurrency (best kept)")
    args = ap.parse_args()
    print(f"Map of {args.n} branches, one {args.delay:g} s scripted call each, SQLite (FULL), "
          f"best of {args.repeat}")
    print("| max_concurrency | wall s | CPU s | ideal s | ratio |\n|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for c in args.concurrency:
            runs = [measure(args.n, args.delay, c, folder, i) for i in range(args.repeat)]
            wall, cpu, ideal = min(runs)
            print(f"| {c} | {wall:.2f} | {cpu:.2f} | {ideal:.2f} | {wall / ideal:.2f}× |",
                  flush=True)


if __name__ == "__main__":
    main()
