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


ADD = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def test_streamed_tool_calls_come_as_fragments_and_end_as_completes_reply(llama_server):
    """Issue 36: the server's streamed ``delta.tool_calls`` (llama.cpp's function-calling
    form, ``tool_choice`` naming the function) are pieces of the calls' text as they come,
    and the streamed ``Completion`` is the one ``complete()`` gives for the same call."""
    prompt = [{"role": "user", "content": "What is 20 + 22? Use the add tool."}]
    kwargs = {"max_tokens": 48, "tools": ADD,
              "tool_choice": {"type": "function", "function": {"name": "add"}}}

    async def go():
        provider = OpenAICompatible(base_url=llama_server, model="gemma", timeout=120.0)
        try:
            items = [p async for p in provider.stream(prompt, **kwargs)]
            return items, await provider.complete(prompt, **kwargs)
        finally:
            await provider.aclose()

    items, whole = asyncio.run(go())
    *pieces, done = items
    flat = [p for x in pieces for p in (x if isinstance(x, list) else [x])]
    assert len(flat) > 2  # the name, then the arguments as the model wrote them
    shown = "".join(flat)
    assert shown.startswith('{"tool_calls": [{"name": "add", "arguments": ')
    assert shown.endswith("}]}")
    calls = json.loads(done.text)["tool_calls"]
    assert [c["name"] for c in calls] == ["add"]
    assert done.text == whole.text  # the same reply, streamed or not
    assert done.prompt_tokens > 0 and done.completion_tokens > 0
