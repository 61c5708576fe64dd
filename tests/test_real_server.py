"""The reference machine through the OpenAI-compatible provider against a real
``python -m llama_cpp.server`` on loopback, started and stopped by the fixture."""

from __future__ import annotations

import pytest

from fsm_engine.llm import OpenAICompatible
from llm_fixtures import gemma_path, llama_server  # noqa: F401  (fixtures)
from test_real_model import check_instance, run_three

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_moderation_through_openai_provider(db_path, notify_file, llama_server):  # noqa: F811
    llm = OpenAICompatible(base_url=llama_server, model="gemma-3-270m", api_key="sk-test-secret")
    eng, records = run_three(db_path, llm)
    for rec in records:
        check_instance(eng, rec)
    for suffix in ("", "-wal"):
        try:
            dump = open(db_path + suffix, "rb").read()
        except FileNotFoundError:
            continue
        assert b"sk-test-secret" not in dump
