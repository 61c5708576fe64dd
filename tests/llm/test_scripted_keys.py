"""Scripted replies keyed by a prompt substring or by the calling instance's input, so
concurrent instances each get their own reply."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import MACHINES, license_files

from fsm_engine import Engine, load_machine
from fsm_engine.errors import ClientError, InvalidInput
from fsm_engine.llm import Scripted
from fsm_engine.llm.base import CALLER_INPUT


def verdict(decision: str) -> str:
    return json.dumps({"decision": decision, "categories": [], "summary": f"{decision} it"})


def ask(provider: Scripted, text: str, caller: dict | None = None) -> str:
    async def go() -> str:
        token = CALLER_INPUT.set(caller)
        try:
            return (await provider.complete([{"role": "user", "content": text}])).text
        finally:
            CALLER_INPUT.reset(token)
    return asyncio.run(go())


def test_keyed_groups_cycle_on_their_own_and_unkeyed_lines_are_the_default() -> None:
    p = Scripted.from_replies([{"match": "alpha", "text": "A1"}, {"text": "default"},
                               {"match": "alpha", "text": "A2"},
                               {"input": {"path": "/x"}, "text": "X"},
                               {"input": "needle", "text": "N"}])
    assert [ask(p, "say alpha") for _ in range(3)] == ["A1", "A2", "A1"]
    assert ask(p, "other") == "default"
    assert ask(p, "other", {"path": "/x", "n": 1}) == "X"
    assert ask(p, "other", {"path": "/y"}) == "default"
    assert ask(p, "other", {"path": "/has/needle/in/it"}) == "N"
    assert ask(p, "alpha", {"path": "/x"}) == "A2"  # the first fitting group in file order


def test_a_call_no_line_fits_is_a_client_error() -> None:
    p = Scripted.from_replies([{"match": "alpha", "text": "A"}])
    with pytest.raises(ClientError, match="no scripted reply"):
        ask(p, "beta")


@pytest.mark.parametrize("line", [{"match": "", "text": "x"}, {"match": 3, "text": "x"},
                                  {"input": [1], "text": "x"}])
def test_bad_keys_are_refused(line: dict) -> None:
    with pytest.raises(InvalidInput):
        Scripted.from_replies([line])


def test_concurrent_instances_get_the_reply_keyed_by_their_input(db_path, notify_file) -> None:
    files = license_files(3)
    decisions = dict(zip(files, ("approve", "review", "reject"), strict=False))
    provider = Scripted.from_replies([{"input": {"path": f}, "text": verdict(d),
                                       "prompt_tokens": 5, "completion_tokens": 5, "delay_s": 0.01}
                                      for f, d in decisions.items()])
    engine = Engine(db_path, llm=provider, seed=1)
    machine, ref = load_machine(str(MACHINES / "moderation.py"))
    engine.register(machine, ref)
    ids = engine.start_many(machine, [{"path": f} for f in files])

    async def go():
        try:
            return await engine.run_many(ids)
        finally:
            await engine.aclose()
    records = asyncio.run(go())
    assert {r.context["path"]: r.context["verdict"]["decision"] for r in records} == decisions
    assert all(r.context["verdict_source"] == "model" for r in records)


def test_the_docs_script_example_is_a_valid_script(tmp_path) -> None:
    """The example script of docs/how-to/models.md (it was the README's) loads as written."""
    from conftest import ROOT
    text = (ROOT / "docs" / "how-to" / "models.md").read_text(encoding="utf-8")
    block = text.split("## Scripted replies", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme.jsonl"
    path.write_text(block, encoding="utf-8")
    provider = Scripted(path)
    assert len(provider.replies) == len(block.strip().splitlines()) == 6
    assert sum(r.keyed for r in provider.replies) == 2
