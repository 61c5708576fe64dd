"""The embedded model's child process: template choice, crash isolation, restart, cleanup.

The ``model`` tests crash the real llama.cpp child (SIGSEGV / SIGKILL) under real
instances; the parent process (this pytest) must survive every one of them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import alive
from pydantic import BaseModel

from fsm_engine import Engine, Machine, RetryPolicy, State, Step, Transition
from fsm_engine.llm import LocalLlama
from fsm_engine.llm.serve import Refused, choose_template

try:
    from llm_fixtures import gemma_path, require_llama_cpp  # noqa: F401
except ImportError:
    from tests.helpers.llm_fixtures import gemma_path, require_llama_cpp  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("metadata", "chat_format", "expected"), [
    ({"general.architecture": "gemma3"}, None, "gemma3"),
    ({"general.architecture": "gemma2"}, None, "gemma3"),
    ({"general.architecture": "qwen2", "tokenizer.chat_template": "{{x}}"}, None, "own"),
    ({"general.architecture": "gemma3", "tokenizer.chat_template": "{{x}}"}, None, "own"),
    ({"general.architecture": "llama"}, "chatml", "named"),
])
def test_template_choice(metadata, chat_format, expected):
    assert choose_template(metadata, chat_format) == expected


@pytest.mark.parametrize("metadata", [{"general.architecture": "llama"}, {}])
def test_a_model_without_template_that_is_not_gemma_is_refused(metadata):
    with pytest.raises(Refused, match="no chat template and is not a Gemma model"):
        choose_template(metadata, None)


def _poll(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class Ctx(BaseModel):
    text: str
    answer: str = ""
    source: str = ""


def _machine(kill_first_call):
    async def ask(ctx: Ctx, step: Step) -> dict:
        kill_first_call()
        out = await step.llm.complete(
            [{"role": "user", "content": f"Write a long story about {ctx.text}."}],
            max_tokens=40)
        return {"answer": out.text or "(empty)", "source": "model"}

    def rule(ctx: Ctx) -> dict:
        return {"answer": "rule", "source": "rules"}

    return Machine(
        name="crashy", context=Ctx, initial="infer", max_transitions=10,
        states=[State("infer", action=ask, timeout=120, fallback="rules",
                      retry=RetryPolicy(max_attempts=3, initial_interval=0.2, jitter=0.0)),
                State("rules", action=rule),
                State("done", final=True),
                State("failed", final=True, failure=True)],
        transitions=[Transition("ok", "infer", "done"), Transition("ok", "rules", "done")])


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL])
def test_a_crash_mid_call_is_retried_and_every_instance_ends_final(gemma_path, tmp_path, sig):  # noqa: F811
    provider = LocalLlama(model_path=gemma_path)
    killed: list[int] = []

    def kill_first_call() -> None:
        if not killed and provider.server is not None and provider.server.pid:
            killed.append(provider.server.pid)  # crash it while this call generates
            asyncio.get_running_loop().call_later(0.4, os.kill, killed[0], sig)

    engine = Engine(str(tmp_path / "fsm.db"), llm=provider, concurrency=2, breaker=None)

    async def go():
        await provider.load()
        ids = engine.start_many(_machine(kill_first_call), [{"text": f"cat {i}"} for i in range(10)])
        try:
            return await engine.run_many(ids)
        finally:
            await engine.aclose()

    records = asyncio.run(go())
    assert [r.status for r in records] == ["completed"] * 10
    assert killed and not alive(killed[0])
    assert provider.server is not None and provider.server.restarts >= 1
    store = Engine(str(tmp_path / "fsm.db")).store
    errors = [a.error for r in records for a in store.attempts(r.id)]
    assert any("process died during the call" in e and sig.name in e for e in errors), errors
    new_pid = provider.server.pid
    asyncio.run(provider.aclose())
    assert new_pid is not None and not alive(new_pid)  # stopped with the provider


CHILD_OF_KILLED_PARENT = """
import asyncio, sys
from fsm_engine.llm import LocalLlama
provider = LocalLlama(model_path=sys.argv[1])
asyncio.run(provider.load())
print(provider.server.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.model
def test_the_child_dies_with_a_sigkilled_parent(gemma_path):  # noqa: F811
    parent = subprocess.Popen([sys.executable, "-c", CHILD_OF_KILLED_PARENT, gemma_path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid)
        parent.kill()
        parent.wait(timeout=10)
        assert _poll(lambda: not alive(child_pid)), "model child outlived its SIGKILLed parent"
    finally:
        parent.kill()


@pytest.mark.model
def test_token_count_matches_the_servers_prompt_tokens(gemma_path):  # noqa: F811
    provider = LocalLlama(model_path=gemma_path)
    ask = [{"role": "system", "content": "You are terse."},
           {"role": "user", "content": "Name one colour of the rainbow, please."}]

    async def go():
        try:
            counted = await provider.count_tokens(ask)
            done = await provider.complete(ask, max_tokens=4)
            return counted, done.prompt_tokens
        finally:
            await provider.aclose()

    counted, billed = asyncio.run(go())
    assert billed <= counted <= billed + 12  # conservative: never under the real prompt


@pytest.mark.model
@pytest.mark.slow
def test_a_frozen_child_is_killed_and_the_step_retried(gemma_path, tmp_path):  # noqa: F811
    """SIGSTOP: the child answers nothing; the call times out, the child is found frozen,
    killed and restarted, and the instance completes on a retry."""
    provider = LocalLlama(model_path=gemma_path)
    stopped: list[int] = []

    def freeze_first_call() -> None:
        if not stopped and provider.server is not None and provider.server.pid:
            stopped.append(provider.server.pid)
            asyncio.get_running_loop().call_later(0.3, os.kill, stopped[0], signal.SIGSTOP)

    machine = _machine(freeze_first_call)
    infer = machine.states[0]
    from dataclasses import replace
    machine = replace(machine, states=[replace(infer, timeout=6.0, retry=RetryPolicy(
        max_attempts=5, initial_interval=0.2, jitter=0.0)), *machine.states[1:]])
    engine = Engine(str(tmp_path / "fsm.db"), llm=provider, breaker=None)

    async def go():
        await provider.load()
        iid = engine.start(machine, {"text": "a frozen lake"})
        try:
            return await engine.run(iid)
        finally:
            await engine.aclose()
            await provider.aclose()

    rec = asyncio.run(go())
    assert rec.status == "completed" and rec.context["source"] == "model"
    assert stopped and not alive(stopped[0])  # the frozen child was killed
    assert provider.server.restarts >= 1
