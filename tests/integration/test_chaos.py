"""Chaos: 1,000 moderation instances against a model that misbehaves on 30% of calls.

Every instance must end (completed, or failed with a reason), and the tokens
the instances recorded must equal, to the token, what the fault injector
reported to its callers.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from conftest import GOOD_VERDICT, MACHINES, license_files, scripted

from fsm_engine import Engine
from fsm_engine.llm import FaultInjector

pytestmark = pytest.mark.slow

N = 1000
RATES = {"timeout": 0.05, "hang": 0.02, "http429": 0.05, "http500": 0.05, "malformed": 0.05,
         "fenced": 0.04, "truncated": 0.04}


def test_thousand_instances_under_faults(db_path, notify_file):
    files = license_files()
    assert files, "needs /usr/share/common-licenses"
    # hang_s stays far below infer's 120 s state timeout: a hang is a slow answer here
    llm = FaultInjector(scripted(GOOD_VERDICT), RATES, seed=42, hang_s=0.2, timeout_s=0.05)
    eng = Engine(db_path, llm=llm, seed=3)
    try:
        ids = [eng.start(str(MACHINES / "moderation.py"), {"path": files[i % len(files)]})
               for i in range(N)]
        started = time.perf_counter()
        results = asyncio.run(eng.run_many(ids))
        elapsed = time.perf_counter() - started
        recs = [eng.store.get(i) for i in ids]
        assert all(not isinstance(r, Exception) for r in results), results
        assert all(r.status == "completed" or (r.status == "failed" and r.reason) for r in recs)
        assert sum(r.tokens_used for r in recs) == llm.total_tokens
        for rec in recs:
            spent = (sum(h.tokens for h in eng.store.history(rec.id))
                     + sum(a.tokens for a in eng.store.attempts(rec.id)))
            assert rec.tokens_used == spent, rec.id
        done = [r for r in recs if r.status == "completed"]
        lines = [json.loads(x) for x in notify_file.read_text().splitlines()]
        assert sorted(x["instance_id"] for x in lines) == sorted(r.id for r in done)
        sources = {}
        for r in done:
            src = r.context["verdict_source"]
            sources[src] = sources.get(src, 0) + 1
        print(f"\n{N} instances in {elapsed:.1f}s: {len(done)} completed {sources}, "
              f"{llm.calls} calls, faults {dict(llm.faults)}, {llm.total_tokens} tokens")
    finally:
        eng.close()
