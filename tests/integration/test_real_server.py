"""The reference machine through the OpenAI-compatible provider against a real
``python -m llama_cpp.server`` on loopback, started and stopped by the fixture.

Three license files run at once against the single-threaded server (the provider's
concurrency limit queues them, each request's timeout follows the state's), plus one
instance whose budget cannot fit a prompt: every instance ends final, none by a
timeout, each verdict's source matches the path its history took, and every model
call names the model (read from the server's ``/v1/models``)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MACHINES, license_files
from instance_audit import check_instance
from llm_fixtures import gemma_path  # noqa: F401  (fixture; llama_server: tests/conftest.py)

from fsm_engine import Engine
from fsm_engine.llm import OpenAICompatible

pytestmark = [pytest.mark.model, pytest.mark.slow]

MODERATION = str(MACHINES / "moderation.py")
#: The transition out of which each verdict source comes.
PATHS = {"model": ("validate", "valid"), "constrained": ("degraded-infer", "degraded"),
         "rules": ("degraded-infer", "degraded")}


def check_path(eng: Engine, rec) -> None:
    """The verdict's source is the one the history's path produces."""
    rows = eng.store.history(rec.id)
    source = rec.context["verdict_source"]
    into_output = [(h.source, h.trigger) for h in rows if h.dest == "output"]
    if into_output == [("rule-verdict", "ruled")]:
        assert source == "rules"
    else:
        assert into_output == [PATHS[source]], (source, into_output)
    if source == "constrained":  # it came from a model call under the schema
        row = next(h for h in rows if (h.source, h.trigger) == PATHS["constrained"])
        assert row.detail.get("llm_calls")


def test_moderation_through_openai_provider(db_path, notify_file, llama_server):
    llm = OpenAICompatible(base_url=llama_server, api_key="sk-test-secret")  # no model named
    assert llm.concurrency == 1  # loopback: one request at a time
    eng = Engine(db_path, llm=llm, seed=7)
    files = license_files()[:3]
    ids = [eng.start(MODERATION, {"path": p}) for p in files]
    ids.append(eng.start(MODERATION, {"path": files[0]}, token_budget=1))

    async def go() -> list:
        try:
            return await eng.run_many(ids)
        finally:
            await llm.aclose()
    records = asyncio.run(go())
    for rec in records[:3]:
        check_instance(eng, rec)
    broke = records[3]
    assert (broke.status, broke.tokens_used, broke.context["verdict_source"]) == (
        "completed", 0, "rules")
    for rec in records:
        assert rec.status == "completed", (rec.reason, rec.last_error)
        check_path(eng, rec)
        errors = [a.error_class for a in eng.store.attempts(rec.id)]
        errors += [h.reason for h in eng.store.history(rec.id) if h.reason]
        assert "ProviderTimeout" not in errors and "timeout" not in errors, errors
        calls = [c for h in eng.store.history(rec.id) for c in h.detail.get("llm_calls", [])]
        assert llm.model and all(c["model"] == f"openai:{llm.model}" for c in calls)
    for suffix in ("", "-wal"):
        try:
            dump = open(db_path + suffix, "rb").read()
        except FileNotFoundError:
            continue
        assert b"sk-test-secret" not in dump


def test_primary_server_stopped_mid_run_falls_back_to_the_embedded_model(
        db_path, notify_file, gemma_path, tmp_path):  # noqa: F811
    """Models per state for real: infer calls ``primary`` (a llama_cpp.server on loopback),
    degraded-infer calls ``fallback`` (the embedded model).  The server is stopped once the
    first instance has its answer: the primary's breaker opens and every instance completes
    on the fallback model."""
    import asyncio
    import subprocess
    import sys

    from conftest import MACHINES, license_files
    from llm_fixtures import _wait_ready, free_port

    from fsm_engine import BreakerPolicy, Engine
    from fsm_engine.llm import LocalLlama

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", gemma_path, "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048", "--chat_format", "gemma"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(server, f"http://127.0.0.1:{port}/v1/models", 120)
        primary = OpenAICompatible(base_url=f"http://127.0.0.1:{port}/v1", model="gemma-remote")
        fallback = LocalLlama(gemma_path)
        eng = Engine(db_path, llm={"primary": primary, "fallback": fallback}, concurrency=2,
                     breaker=BreakerPolicy(min_calls=2, failure_rate=0.5, cooldown=600))

        def stop_primary_after_first_answer(rec) -> None:
            if rec.state == "validate" and server.poll() is None:
                server.kill()
                server.wait(timeout=10)

        ids = [eng.start(str(MACHINES / "moderation.py"), {"path": p}) for p in license_files()[:4]]
        records = asyncio.run(eng.run_many(ids, stop_primary_after_first_answer))
        asyncio.run(fallback.aclose())
    finally:
        server.kill()
    assert server.poll() is not None  # it was stopped mid-run
    for rec in records:
        check_instance(eng, rec)
    assert [r.status for r in records] == ["completed"] * 4
    assert eng.store.get_breaker("openai:gemma-remote").state == "open"
    rows = [h for r in records for h in eng.store.history(r.id)]
    assert any(h.kind == "fallback" and h.reason == "circuit_open" for h in rows)
    fallback_calls = [c["model"] for h in rows if h.source == "degraded-infer"
                      for c in h.detail.get("llm_calls", [])]
    assert fallback_calls and all(m.startswith("local:") for m in fallback_calls)
