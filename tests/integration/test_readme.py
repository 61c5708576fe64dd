"""The README's example code runs as written (the model swapped for a scripted one)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from conftest import ROOT, scripted

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_has_the_machine_and_the_run_example():
    assert len(BLOCKS) >= 2
    assert "machine = Machine(" in BLOCKS[0] and "engine.run(" in BLOCKS[1]


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import fsm_engine.llm

    monkeypatch.chdir(tmp_path)
    answer = {"text": "7", "prompt_tokens": 9, "completion_tokens": 1}
    monkeypatch.setattr(fsm_engine.llm, "provider_from_spec", lambda spec: scripted(answer))
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(BLOCKS[0], "README.md#machine", "exec"), namespace)
    exec(compile(BLOCKS[1], "README.md#run", "exec"), namespace)
    record = namespace["record"]
    assert (record.state, record.status, record.tokens_used) == ("done", "completed", 10)
    assert record.context["answer"] == "7"


def test_readme_streamed_action_returns_the_reply_text(tmp_path: Path):
    """The Streaming section's ``ask``: ``stream(...).text()`` is the reply's text, a str
    (issue 36: it was the Completion, read by the README as the text)."""
    from fsm_engine import Engine, Machine, State, Transition
    block = next(b for b in BLOCKS if "step.llm.stream(" in b)
    namespace: dict = {"__name__": "readme_stream"}
    exec(compile(BLOCKS[0], "README.md#machine", "exec"), namespace)
    exec(compile(block, "README.md#stream", "exec"), namespace)
    machine = Machine(name="qa_streamed", context=namespace["Ctx"], initial="ask",
                      states=[State("ask", action=namespace["ask"]), State("done", final=True)],
                      transitions=[Transition("ok", "ask", "done")])
    llm = scripted({"text": "seven", "chunks": ["se", "ven"], "prompt_tokens": 9,
                    "completion_tokens": 2})
    engine = Engine(str(tmp_path / "fsm.db"), llm=llm)
    try:
        record = asyncio.run(engine.run(engine.start(machine, {"text": "Name a prime."})))
    finally:
        engine.close()
    assert (record.status, record.context["answer"]) == ("completed", "seven")


def test_readme_commands_are_the_ones_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ci:test-command" in ci
    assert README.count("<!-- ci:test-command -->") == 1
    assert README.count("<!-- ci:main-command -->") == 1
