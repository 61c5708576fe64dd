"""The embedded model's child is private to its parent (issue 19, finding 11).

A real child (the default model) is started with secrets in the parent's environment:
its HTTP port refuses requests without the per-child key, a browser's preflight gets no
``Access-Control-Allow-Origin``, and none of the secrets reaches ``/proc/<child>/environ``;
the key itself is neither on the child's command line nor in its environment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fsm_engine.errors import ClientError
from fsm_engine.llm import LocalLlama
from fsm_engine.llm.child import child_env
from fsm_engine.llm.local import default_threads

try:
    from llm_fixtures import qwen_path  # noqa: F401
except ImportError:
    from tests.helpers.llm_fixtures import qwen_path  # noqa: F401

SECRETS = {
    "FSM_DB": "postgresql://fsm:hunter2-db@db.example/fsm",
    "DATABASE_URL": "postgresql://app:hunter2-url@db.example/app",
    "HTTPS_PROXY": "http://me:hunter2-proxy@proxy.example:3128",
    "http_proxy": "http://me:hunter2-lower@proxy.example:3128",
    "PGPASSWORD": "hunter2-pg",
    "OPENAI_API_KEY": "sk-hunter2-openai",
    "FSM_VIEW_TOKEN": "hunter2-view",
}


@pytest.fixture(scope="module")
def child(qwen_path) -> Iterator[LocalLlama]:  # noqa: F811
    mp = pytest.MonkeyPatch()
    for name, value in SECRETS.items():
        mp.setenv(name, value)
    provider = LocalLlama(qwen_path)
    try:
        asyncio.run(provider.load())
    finally:
        mp.undo()
    yield provider
    asyncio.run(provider.aclose())


def _root(provider: LocalLlama) -> str:
    assert provider.server is not None and provider.server.base_url is not None
    return provider.server.base_url.removesuffix("/v1")


ASK = {"model": "any", "max_tokens": 1,
       "messages": [{"role": "user", "content": "Say OK."}]}


def test_the_child_environment_is_an_allow_list():
    env = child_env({**SECRETS, "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8",
                     "LC_ALL": "C", "OMP_NUM_THREADS": "2", "FSM_LLM_THREADS": "1",
                     "AWS_SECRET_ACCESS_KEY": "x", "SOMETHING_ELSE": "y"})
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C",
                   "OMP_NUM_THREADS": "2", "FSM_LLM_THREADS": "1"}


def test_threads_are_the_usable_cpus_unless_fsm_llm_threads_says(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # load does not matter
    assert default_threads({}) == 3
    assert default_threads({"FSM_LLM_THREADS": "1"}) == 1
    for bad in ("0", "two", "-1"):
        with pytest.raises(ClientError, match="FSM_LLM_THREADS"):
            default_threads({"FSM_LLM_THREADS": bad})


@pytest.mark.model
def test_a_request_without_the_key_is_refused(child):
    root = _root(child)
    with httpx.Client(timeout=60, trust_env=False) as http:
        assert http.post(f"{root}/v1/chat/completions", json=ASK).status_code == 401
        wrong = {"Authorization": "Bearer sk-no-key"}
        assert http.post(f"{root}/v1/chat/completions", json=ASK, headers=wrong).status_code == 401
        assert http.post(f"{root}/extras/tokenize/count",
                         json={"input": "x"}).status_code == 401
        assert http.get(f"{root}/v1/models").status_code == 401
        assert http.get(f"{root}/openapi.json").status_code == 404  # no API description either
    done = asyncio.run(child.complete([{"role": "user", "content": "Say OK."}], max_tokens=2))
    assert done.completion_tokens >= 1  # the provider itself holds the key


@pytest.mark.model
def test_a_browser_preflight_gets_no_allow_origin(child):
    root = _root(child)
    with httpx.Client(timeout=60, trust_env=False) as http:
        pre = http.options(f"{root}/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        simple = http.post(f"{root}/v1/chat/completions", json=ASK,
                           headers={"Origin": "http://evil.example"})
    for response in (pre, simple):
        assert "access-control-allow-origin" not in response.headers, response.headers


@pytest.mark.model
def test_the_parents_secrets_and_the_key_are_not_in_the_childs_environment(child):
    assert child.server is not None and child.server.pid is not None
    proc = Path("/proc") / str(child.server.pid)
    environ = (proc / "environ").read_bytes()
    cmdline = (proc / "cmdline").read_bytes()
    for name, value in SECRETS.items():
        assert value.encode() not in environ, name
        assert f"{name}=".encode() not in environ.split(b"\0")[0] and \
            not any(entry.startswith(f"{name}=".encode()) for entry in environ.split(b"\0"))
    key = child.server.api_key
    assert key and len(key) >= 32
    assert key.encode() not in environ and key.encode() not in cmdline
    names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
    assert "PATH" in names  # what llama.cpp needs still passes


@pytest.mark.model
def test_a_child_busy_generating_still_answers_the_liveness_check(child):
    """The authenticated liveness route must not queue behind the model (else a busy child
    is taken for a frozen one and killed)."""
    async def go() -> bool:
        ask = [{"role": "user", "content": "Count from 1 to 300, one number per line."}]
        call = asyncio.create_task(child.complete(ask, max_tokens=120))
        await asyncio.sleep(3.0)  # the generation is running
        try:
            assert not call.done()
            return await child.server.alive(timeout=2.0)
        finally:
            await call
    assert asyncio.run(go())
