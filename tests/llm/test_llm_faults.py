"""FaultInjector: every fault kind, reproducibility, token accounting."""

from __future__ import annotations

import asyncio
import json

import pytest

from fsm_engine.errors import InvalidInput, ProviderError, ProviderTimeout, RateLimited, ServerError
from fsm_engine.llm import FaultInjector, Scripted, parse_fault_spec
from fsm_engine.llm.faults import FAULT_KINDS, mangle_json

MSG = [{"role": "user", "content": "hi"}]
REPLY = {"text": '{"answer": 42, "why": "because"}', "prompt_tokens": 10, "completion_tokens": 6}


def inject(kind: str, **kwargs) -> FaultInjector:
    return FaultInjector(Scripted.from_replies([REPLY]), {kind: 1.0}, seed=1, **kwargs)


def call(provider):
    return asyncio.run(provider.complete(MSG))


def test_parse_fault_spec():
    assert parse_fault_spec("timeout=0.1, hang=0.05,http429=0.1") == {
        "timeout": 0.1, "hang": 0.05, "http429": 0.1}
    assert parse_fault_spec("") == {} and parse_fault_spec(None) == {}
    for bad, why in [("explode=0.1", "unknown fault 'explode'"), ("timeout=x", "between 0 and 1"),
                     ("timeout", "between 0 and 1"), ("hang=1.5", "between 0 and 1"),
                     ("hang=nan", "between 0 and 1"), ("timeout=0.6,hang=0.6", "above 1"),
                     ("hang=0.1,hang=0.2", "given twice")]:
        with pytest.raises(InvalidInput, match=why):
            parse_fault_spec(bad)
    with pytest.raises(InvalidInput):
        FaultInjector(Scripted.from_replies([REPLY]), {"hang": -0.1})


def test_no_faults_passes_through():
    provider = FaultInjector(Scripted.from_replies([REPLY]), {}, seed=0)
    done = call(provider)
    assert done.text == REPLY["text"] and provider.faults == {}
    # its own circuit breaker name: injected faults must not open the real provider's breaker
    assert (provider.name, provider.model) == ("faults+scripted", "scripted")


def test_seed_reproduces_the_fault_sequence():
    def sequence(seed):
        provider = FaultInjector(Scripted.from_replies([REPLY]),
                                 {"malformed": 0.3, "fenced": 0.3}, seed=seed)
        return [call(provider).text for _ in range(40)]

    first = sequence(7)
    assert first == sequence(7)
    assert first != sequence(8)
    assert len(set(first)) == 3  # clean, malformed and fenced all occurred


def test_timeout_raises_without_calling_inner():
    provider = inject("timeout", timeout_s=0.01)
    with pytest.raises(ProviderTimeout) as info:
        call(provider)
    assert info.value.prompt_tokens == 0 and provider.inner.calls == 0
    assert provider.faults == {"timeout": 1} and provider.total_tokens == 0


def test_http429_carries_retry_after_in_range():
    provider = inject("http429", retry_after=(0.2, 0.3))
    with pytest.raises(RateLimited) as info:
        call(provider)
    assert info.value.status == 429 and 0.2 <= info.value.retry_after <= 0.3
    assert provider.inner.calls == 0


def test_http500_bills_the_inner_usage():
    provider = inject("http500")
    with pytest.raises(ServerError) as info:
        call(provider)
    err = info.value
    assert (err.status, err.prompt_tokens, err.completion_tokens) == (500, 10, 6)
    assert (provider.prompt_tokens, provider.completion_tokens) == (10, 6)


def test_hang_is_cut_by_a_caller_timeout():
    provider = inject("hang", hang_s=30.0)

    async def with_deadline():
        return await asyncio.wait_for(provider.complete(MSG), timeout=0.1)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(with_deadline())
    assert provider.faults == {"hang": 1} and provider.inner.calls == 0


def test_short_hang_then_answers():
    assert call(inject("hang", hang_s=0.01)).text == REPLY["text"]


def test_malformed_is_invalid_json():
    done = call(inject("malformed"))
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.text)
    assert "42" in done.text and done.completion_tokens == 6
    for text in ["plain prose", "", "[]", "{}", '[1, 2]', '{"a": {"b": 1}}']:
        with pytest.raises(json.JSONDecodeError):
            json.loads(mangle_json(text))


def test_fenced_wraps_the_real_text():
    done = call(inject("fenced"))
    assert "```json\n" + REPLY["text"] + "\n```" in done.text
    assert not done.text.startswith("{")


def test_truncated_halves_and_says_length():
    done = call(inject("truncated"))
    assert done.text == REPLY["text"][: len(REPLY["text"]) // 2]
    assert done.finish_reason == "length"


def test_huge_is_huge():
    done = call(inject("huge", huge_bytes=200 * 1024))
    assert len(done.text.encode()) == 200 * 1024 and done.text.startswith(REPLY["text"])
    assert done.completion_tokens == 6


def test_token_counters_match_what_callers_saw():
    inner = Scripted.from_replies([REPLY, {**REPLY, "error": "http500"}])
    rates = {kind: 0.1 for kind in FAULT_KINDS if kind != "hang"}
    provider = FaultInjector(inner, rates, seed=42, timeout_s=0.0, retry_after=(0.0, 0.0))
    seen_prompt = seen_completion = 0

    async def drive():
        nonlocal seen_prompt, seen_completion
        for _ in range(200):
            try:
                done = await provider.complete(MSG)
            except ProviderError as err:
                seen_prompt += err.prompt_tokens
                seen_completion += err.completion_tokens
            else:
                seen_prompt += done.prompt_tokens
                seen_completion += done.completion_tokens

    asyncio.run(drive())
    assert provider.calls == 200
    assert set(provider.faults) == set(rates)  # every kind happened at least once
    assert (provider.prompt_tokens, provider.completion_tokens) == (seen_prompt, seen_completion)
    assert seen_prompt == 10 * inner.calls  # each inner call billed exactly once
    assert inner.calls == 200 - provider.faults["timeout"] - provider.faults["http429"]
