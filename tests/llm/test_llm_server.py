"""OpenAICompatible against a real ``llama_cpp.server`` serving Gemma (marked ``model``)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from fsm_engine.llm import OpenAICompatible

try:  # pytest puts tests/ (rootless) or the repo root (tests as a package) on sys.path
    from llm_fixtures import gemma_path  # noqa: F401
except ImportError:
    from tests.helpers.llm_fixtures import gemma_path  # noqa: F401

pytestmark = pytest.mark.model
ASK = [{"role": "user", "content": "Name one colour."}]
PERSON = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def call(base_url: str, messages, **kwargs):
    """One completion through a fresh provider; returns (completion, its json_mode after)."""
    async def go():
        provider = OpenAICompatible(base_url=base_url, model="gemma", timeout=120.0)
        try:
            return await provider.complete(messages, **kwargs), provider.json_mode
        finally:
            await provider.aclose()

    return asyncio.run(go())


def test_completion_over_http_reports_usage(llama_server):
    done, _ = call(llama_server, ASK, max_tokens=16)
    assert done.text.strip() and done.prompt_tokens > 0 and done.completion_tokens > 0
    assert done.finish_reason in ("stop", "length")


def test_max_tokens_gives_length(llama_server):
    prompt = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]
    done, _ = call(llama_server, prompt, max_tokens=6)
    assert done.finish_reason == "length" and done.completion_tokens == 6


def test_json_schema_is_honoured_via_the_llama_cpp_form(llama_server):
    prompt = [{"role": "user", "content": "Invent a person. Reply in JSON with name and age."}]
    done, mode = call(llama_server, prompt, max_tokens=64, json_schema=PERSON)
    jsonschema.validate(json.loads(done.text), PERSON)
    assert mode == "json_object"  # llama_cpp.server refuses OpenAI's json_schema form
