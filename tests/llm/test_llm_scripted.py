"""Scripted provider and provider selection."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from fsm_engine.errors import ClientError, InvalidInput, ProviderTimeout, ProviderUnavailable, RateLimited, ServerError
from fsm_engine.llm import Completion, FaultInjector, Provider, Scripted, provider_from_spec

MSG = [{"role": "user", "content": "hi"}]


def write_script(tmp_path, lines: list) -> str:
    path = tmp_path / "script.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def run(coro):
    return asyncio.run(coro)


def test_serves_in_order_with_usage_and_cycles(tmp_path):
    path = write_script(tmp_path, [
        {"text": "one", "prompt_tokens": 12, "completion_tokens": 30},
        "",
        {"text": "two", "prompt_tokens": 5, "completion_tokens": 7, "finish_reason": "length"},
    ])
    provider = Scripted(path)

    async def four():
        return [await provider.complete(MSG) for _ in range(4)]

    got = run(four())
    assert [c.text for c in got] == ["one", "two", "one", "two"]
    assert got[0] == Completion("one", 12, 30, "stop", "script.jsonl")
    assert got[1].finish_reason == "length" and got[1].truncated
    assert got[0].total_tokens == 42
    assert provider.calls == 4 and provider.requests[0] == MSG
    assert isinstance(provider, Provider)


def test_delay_is_awaited_not_blocking():
    provider = Scripted.from_replies([{"text": "slow", "delay_s": 0.2}])

    async def three_at_once():
        started = time.perf_counter()
        done = await asyncio.gather(*(provider.complete(MSG) for _ in range(3)))
        return done, time.perf_counter() - started

    done, elapsed = run(three_at_once())
    assert [c.text for c in done] == ["slow"] * 3
    assert 0.2 <= elapsed < 0.5  # concurrent sleeps, not 0.6 s in a row


@pytest.mark.parametrize("kind, cls, status", [
    ("timeout", ProviderTimeout, None), ("unavailable", ProviderUnavailable, None),
    ("http429", RateLimited, 429), ("http500", ServerError, 500), ("http400", ClientError, 400),
])
def test_error_lines_raise_with_billed_usage(kind, cls, status):
    provider = Scripted.from_replies([
        {"error": kind, "retry_after": 0.25, "prompt_tokens": 9, "completion_tokens": 4},
        {"text": "after"},
    ])
    with pytest.raises(cls) as info:
        run(provider.complete(MSG))
    err = info.value
    assert (err.status, err.prompt_tokens, err.completion_tokens) == (status, 9, 4)
    assert err.retry_after == 0.25
    assert err.retryable is (kind != "http400")
    assert run(provider.complete(MSG)).text == "after"


def test_counter_is_safe_under_concurrency():
    provider = Scripted.from_replies([{"text": str(i)} for i in range(5)])

    async def many():
        return await asyncio.gather(*(provider.complete(MSG) for _ in range(50)))

    texts = sorted(c.text for c in run(many()))
    assert texts == sorted([str(i) for i in range(5)] * 10)
    assert provider.calls == 50


@pytest.mark.parametrize("bad, why", [
    ('{"text": "x", ', "bad script line"),
    ('["a list"]', "expected a JSON object"),
    ('{"txt": "typo"}', "unknown key"),
    ('{"text": "x", "prompt_tokens": -1}', "prompt_tokens"),
    ('{"text": "x", "error": "http418"}', "unknown error"),
    ('{"text": "x", "delay_s": "soon"}', "delay_s"),
    ('{"chunks": ["x"], "chunk_delay_s": NaN}', "chunk_delay_s"),  # (it meant no delay)
    ('{"text": "x", "delay_s": Infinity}', "delay_s"),
    ('{"text": ' + "[" * 5000 + "]" * 5000 + "}", "nests deeper than"),  # issue 36
])
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    path = write_script(tmp_path, [{"text": "ok"}, "", bad])
    with pytest.raises(InvalidInput) as info:
        Scripted(path)
    message = str(info.value)
    assert f"{path}:3:" in message and why in message
    assert "\n" not in message


def test_empty_and_missing_scripts_are_invalid_input(tmp_path):
    with pytest.raises(InvalidInput, match="no replies"):
        Scripted(write_script(tmp_path, [""]))
    with pytest.raises(InvalidInput, match="cannot read script"):
        Scripted(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidInput, match="reply #1"):
        Scripted.from_replies([{"text": "ok"}, {"completion_tokens": 3}])


def test_provider_from_spec(tmp_path, monkeypatch):
    path = write_script(tmp_path, [{"text": "x"}])
    assert isinstance(provider_from_spec(f"scripted:{path}"), Scripted)
    wrapped = provider_from_spec(f"scripted:{path}", faults="http500=0.5", seed=3)
    assert isinstance(wrapped, FaultInjector) and wrapped.rates == {"http500": 0.5}
    monkeypatch.setenv("FSM_LLM", f"scripted:{path}")
    assert isinstance(provider_from_spec(None), Scripted)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert provider_from_spec("openai:my-model").model == "my-model"
    for bad in ("gpt", "scripted", "scriptedx:y", ""):
        if bad == "":
            monkeypatch.setenv("FSM_LLM", "nonsense")
        with pytest.raises(InvalidInput, match="unknown LLM provider"):
            provider_from_spec(bad or None)


def test_default_spec_prefers_openai_base_url(monkeypatch):
    from fsm_engine.llm.openai_compat import OpenAICompatible
    from fsm_engine.llm.select import default_spec

    monkeypatch.delenv("FSM_LLM", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert default_spec() == "local"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("FSM_MODEL", "m1")
    provider = provider_from_spec(None)
    assert isinstance(provider, OpenAICompatible)
    assert (provider.name, provider.model) == ("openai", "m1")
