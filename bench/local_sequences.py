"""Two sequences at once against one (issue 21): ``python bench/local_sequences.py [--n N]``.

llama-cpp-python runs one sequence per loaded model and exposes no multi-sequence
batching, so "two at once" means two model children (:class:`fsm_engine.llm.LocalLlama`),
each with half the CPUs.  On the first ``N`` of the main job's prompts (the moderation
machine's own messages for ``/usr/share/common-licenses/*``, ``max_tokens`` 64):

* ``one``: one child with every usable CPU, the calls one after another;
* ``two``: two children with half the CPUs each, two calls at once.

Prints both wall times and ``two/one``.  Nothing is asserted: run it on a quiet machine.
The README's figures for the whole job (``fsm run``, which also validates JSON, steps the
machine and writes the store) are in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fsm_engine.llm import LocalLlama  # noqa: E402
from machines.moderation import Moderation, _messages, preprocess  # noqa: E402


def prompts(n: int) -> list[list[dict[str, str]]]:
    out = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*"))[:n]:
        ctx = Moderation(path=path, text=Path(path).read_text(errors="replace"))
        out.append(_messages(ctx.model_copy(update=preprocess(ctx))))
    return out


async def _calls(provider: Any, batch: list[list[dict[str, str]]]) -> None:
    for messages in batch:
        await provider.complete(messages, max_tokens=64, temperature=0.0)


async def one(batch: list[list[dict[str, str]]], cpus: int) -> float:
    model = LocalLlama(n_threads=cpus)
    await model.load()
    try:
        started = time.perf_counter()
        await _calls(model, batch)
        return time.perf_counter() - started
    finally:
        await model.aclose()


async def two(batch: list[list[dict[str, str]]], cpus: int) -> float:
    models = [LocalLlama(n_threads=max(1, cpus // 2)) for _ in range(2)]
    await asyncio.gather(*(m.load() for m in models))
    try:
        started = time.perf_counter()
        await asyncio.gather(_calls(models[0], batch[0::2]), _calls(models[1], batch[1::2]))
        return time.perf_counter() - started
    finally:
        for m in models:
            await m.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10, help="prompts (default 10)")
    args = parser.parse_args()
    batch, cpus = prompts(args.n), len(os.sched_getaffinity(0))
    a = asyncio.run(one(batch, cpus))
    b = asyncio.run(two(batch, cpus))
    print(f"load {os.getloadavg()[0]:.2f}; {len(batch)} prompts; one child x {cpus} threads: "
          f"{a:.1f} s; two children x {max(1, cpus // 2)} thread(s), two at once: {b:.1f} s")
    print(f"two/one: {b / a:.2f}")


if __name__ == "__main__":
    main()
