"""The main job against the embedded model's compute floor (``bench/local_model.py --job``).

In one run on this machine:

1. **rates**: llama.cpp's own prompt-processing and generation speed (tokens/s), read from
   the model child (same build, same threads as the job): tokens counted by llama.cpp's
   counters (``/fsm/perf``), timed by the wall clock around the call (the counters' own
   times lag a call behind), on a cache-cold prompt of about 500 tokens and as the
   difference between a 64-token and a 1-token generation; the model's load
   time and the time to the first token of the job's first prompt (streamed);
2. **job**: the README's main command (``fsm run machines/moderation.py --input
   /usr/share/common-licenses/*``) in a subprocess, its wall time, and from the history
   the prompt and completion tokens of every model call, the calls per instance and each
   verdict's source;
3. **floor** = prompt tokens ÷ prompt rate + completion tokens ÷ generation rate
   (sequential, every prompt token evaluated), and ``job/floor`` = wall ÷ floor, the last
   line printed.  Prefix reuse can take ``job/floor`` below 1.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("river stone lamp orange window quiet seven market copper violin garden thunder "
         "pencil harbour meadow silver ladder cotton engine puzzle").split()


def _cold_prompt(seed: int, words: int = 450) -> list[dict[str, str]]:
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return [{"role": "user", "content": f"{seed}: {text}"}]


async def _timed(provider: Any, messages: list[dict[str, str]], max_tokens: int
                 ) -> tuple[float, dict[str, float]]:
    """Wall seconds of one call, and the change of llama.cpp's token counters over it.

    Only the counters' token counts are used: their times are added at llama.cpp's next
    synchronisation, so over one call they hold part of the call before (seen here: 479
    prompt tokens "in" 0.4 ms, the next 479 in 4.3 s)."""
    before = await provider.server.perf()
    started = time.perf_counter()
    await provider.complete(messages, max_tokens=max_tokens, temperature=0.0)
    wall = time.perf_counter() - started
    after = await provider.server.perf()
    return wall, {k: after[k] - before[k] for k in after}


def _count_prompt(seed: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{seed}: count from 1 to 200, one number per line."}]


async def _first_token_s(provider: Any, messages: list[dict[str, str]]) -> float:
    """Seconds from sending the chat request to its first streamed chunk with text."""
    import httpx

    server = provider.server
    url = server.base_url + "/chat/completions"
    body = {"model": provider.model, "messages": messages, "max_tokens": 8, "stream": True}
    headers = {"Authorization": f"Bearer {server.api_key}"}
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
        async with http.stream("POST", url, json=body, headers=headers) as response:
            async for line in response.aiter_lines():
                if '"content"' in line:
                    return time.perf_counter() - started
    return time.perf_counter() - started


async def rates(threads: int, first: list[dict[str, str]]) -> dict[str, float]:
    """Load time, first-token time, prompt and generation tokens/s at ``threads``."""
    from fsm_engine.llm import LocalLlama

    provider = LocalLlama(n_threads=threads)
    try:
        started = time.perf_counter()
        await provider.load()
        out = {"threads": threads, "load_s": provider.load_seconds or 0.0,
               "start_s": time.perf_counter() - started}
        out["first_token_s"] = await _first_token_s(provider, first)
        # prompt: a cache-cold prompt, one token generated (~30 ms of the ~5 s counted)
        wall, p = await _timed(provider, _cold_prompt(threads), 1)
        out["prompt_tps"] = p["n_p_eval"] / wall
        # generation: the same short prompt shape twice, 1 token and 64: the difference
        one, _ = await _timed(provider, _count_prompt(2 * threads), 1)
        many, g = await _timed(provider, _count_prompt(2 * threads + 1), 64)
        out["gen_tps"] = max(1.0, g["n_eval"] - 1) / max(1e-3, many - one)
        return out
    finally:
        await provider.aclose()


def run_job(db: str, files: list[str], env: dict[str, str]) -> float:
    """Wall seconds of the main command on ``files`` into ``db`` (exit status checked)."""
    argv = [sys.executable, "-m", "fsm_engine.cli", "run", str(ROOT / "machines/moderation.py"),
            "--input", *files, "--db", db]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the job failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall


def job_calls(db: str) -> list[dict[str, Any]]:
    """Per instance: file, decision, source, model calls, prompt and completion tokens."""
    from fsm_engine import Engine

    eng = Engine(db)
    rows = []
    for rec in sorted(eng.store.list(), key=lambda r: r.context.get("path", "")):
        calls = [c for h in eng.store.history(rec.id) for c in h.detail.get("llm_calls", ())]
        verdict = rec.context.get("verdict") or {}
        rows.append({"file": os.path.basename(rec.context.get("path", "")),
                     "decision": verdict.get("decision"),
                     "source": rec.context.get("verdict_source"),
                     "calls": len(calls), "failed": len(eng.store.attempts(rec.id)),
                     "prompt": sum(int(c.get("prompt_tokens", 0)) for c in calls),
                     "completion": sum(int(c.get("completion_tokens", 0)) for c in calls)})
    return rows


def _print_table(rows: list[dict[str, Any]]) -> None:
    print("| file | decision | source | calls | prompt tokens | completion tokens |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['file']} | {r['decision']} | {r['source']} | {r['calls']} | "
              f"{r['prompt']} | {r['completion']} |")


def _first_prompt(files: list[str]) -> list[dict[str, str]]:
    sys.path.insert(0, str(ROOT))
    from machines.moderation import Moderation, _messages, preprocess

    text = Path(files[0]).read_text(encoding="utf-8", errors="replace")
    ctx = Moderation(path=files[0], text=text)
    return _messages(ctx.model_copy(update=preprocess(ctx)))


def main(threads: list[int], files_glob: str) -> None:
    """Print the rates, the job's figures and, last, ``job/floor: X.XX``."""
    files = sorted(glob.glob(files_glob))
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min); "
          f"{len(os.sched_getaffinity(0))} CPUs usable")
    measured = [asyncio.run(rates(n, _first_prompt(files))) for n in threads]
    for m in measured:
        print(json.dumps({k: round(v, 3) for k, v in m.items()}))
    best = min(measured, key=lambda m: 600 / m["prompt_tps"] + 40 / m["gen_tps"])  # one call
    env = {**os.environ, "FSM_LLM_THREADS": str(int(best["threads"]))}
    env.pop("FSM_LLM", None)
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "job.db")
        env["FSM_NOTIFY_FILE"] = os.path.join(tmp, "notify.jsonl")
        wall = run_job(db, files, env)
        rows = job_calls(db)
    _print_table(rows)
    prompt, completion = sum(r["prompt"] for r in rows), sum(r["completion"] for r in rows)
    floor = prompt / best["prompt_tps"] + completion / best["gen_tps"]
    model = sum(1 for r in rows if r["source"] in ("model", "constrained"))
    print(f"threads {int(best['threads'])}: {len(rows)} instances, {model} verdicts from the "
          "model, "
          f"{sum(r['calls'] for r in rows)} calls, {prompt} prompt + {completion} completion "
          "tokens")
    print(f"wall {wall:.1f} s, floor {floor:.1f} s (prompt {prompt / best['prompt_tps']:.1f} s "
          f"at {best['prompt_tps']:.0f} tok/s + completion {completion / best['gen_tps']:.1f} s "
          f"at {best['gen_tps']:.1f} tok/s); load {os.getloadavg()[0]:.2f}")
    print(f"job/floor: {wall / floor:.2f}")
