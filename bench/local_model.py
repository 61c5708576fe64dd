"""What the model's child process costs per call: ``python bench/local_model.py [--calls N]``;
with ``--job``, the main job against the model's compute floor (:mod:`bench.local_job`,
last line ``job/floor: X.XX``).

The same chat request, greedy, is sent N times (after one warm-up), alternately, to

* ``in-process``: ``llama_cpp.Llama.create_chat_completion`` in this process
  (what fsm_engine did before the model moved out of the engine's process);
* ``child``: :class:`fsm_engine.llm.LocalLlama`, i.e. HTTP on loopback to the
  supervised ``fsm_engine.llm.serve`` child (llama-cpp-python's server app).

for ``max_tokens`` 1 (the call is almost all overhead: template, prompt
evaluation, HTTP, JSON) and 32 (a short answer).  Both load the same GGUF with
the same thread count.  Prints per-call medians in milliseconds, the child's
extra milliseconds per call and the ratio child / in-process, and the
generation speed in tokens per second.  Nothing is asserted: run it on a
quiet machine and read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsm_engine.llm import LocalLlama  # noqa: E402
from fsm_engine.llm.local import default_threads  # noqa: E402
from fsm_engine.llm.models import model_path  # noqa: E402
from fsm_engine.llm.serve import _gemma3_handler  # noqa: E402

ASK = [{"role": "system", "content": "You are a content moderator. Answer in one word."},
       {"role": "user", "content": "Text: the Apache License, version 2.0. Verdict:"}]


async def measure(path: str, threads: int, calls: int, max_tokens: int
                  ) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
    """Both loaded at once, calls alternated A B A B … (machine drift hits both alike)."""
    import llama_cpp

    llama = llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=threads,
                            n_threads_batch=threads, seed=0, verbose=False)
    if str(llama.metadata.get("general.architecture", "")).startswith("gemma"):
        llama.chat_handler = _gemma3_handler(llama)
    provider = LocalLlama(n_threads=threads)
    await provider.load()
    inproc, child = [], []
    try:
        for i in range(calls + 1):
            started = time.perf_counter()
            reply = llama.create_chat_completion(messages=ASK, max_tokens=max_tokens,
                                                 temperature=0.0, seed=0)
            took = time.perf_counter() - started
            if i:
                inproc.append((took, reply["usage"]["completion_tokens"]))
            started = time.perf_counter()
            done = await provider.complete(ASK, max_tokens=max_tokens)
            took = time.perf_counter() - started
            if i:
                child.append((took, done.completion_tokens))
    finally:
        await provider.aclose()
        llama.close()
    return inproc, child


def _row(name: str, runs: list[tuple[float, int]]) -> tuple[float, float]:
    ms = statistics.median(t for t, _ in runs) * 1000
    tps = sum(n for _, n in runs) / sum(t for t, _ in runs)
    print(f"  {name:<11} median {ms:8.1f} ms/call   {tps:6.1f} tokens/s (completion)")
    return ms, tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--job", action="store_true",
                        help="the main job and job/floor (threads: 1 and all, the faster)")
    parser.add_argument("--files", default="/usr/share/common-licenses/*",
                        help="the job's inputs (a glob)")
    args = parser.parse_args()
    if args.job:
        from bench.local_job import main as job

        job(sorted({1, len(os.sched_getaffinity(0))}), args.files)
        return
    path = model_path()
    for max_tokens in (1, 32):
        print(f"max_tokens={max_tokens}, {args.calls} calls, {args.threads} thread(s):")
        inproc, child = asyncio.run(measure(path, args.threads, args.calls, max_tokens))
        a, _ = _row("in-process", inproc)
        b, _ = _row("child", child)
        print(f"  child - in-process: {b - a:+.1f} ms/call, ratio {b / a:.3f}")


if __name__ == "__main__":
    main()
