"""OpenAICompatible as operators need it (issue 10, items 5 and 8), against a real stdlib
HTTP server on loopback: the model named or read from ``/v1/models``, a per-provider
concurrency limit, the HTTP timeout following the step's timeout, ``FSM_HTTP_TIMEOUT``,
a reply without usage flagged and estimated, the model in every ``llm_calls`` row and in
``fsm run``'s header."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from fsm_engine import ClientError, Engine, InvalidInput, Machine, ProviderTimeout, State, Transition
from fsm_engine.cli import app
from fsm_engine.llm import OpenAICompatible
from fsm_engine.llm.base import estimate_tokens
from fsm_engine.llm.openai_compat import is_loopback

MSG = [{"role": "user", "content": "hello there"}]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self.reply({"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                                "owned_by": "me"} for m in self.server.models]})

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.inflight += 1
            srv.peak = max(srv.peak, srv.inflight)
            srv.seen.append(request["model"])
        try:
            time.sleep(srv.delay)
            body = {"id": "c", "object": "chat.completion", "created": 0,
                    "model": request["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "four words of reply"}}]}
            if srv.usage:
                body["usage"] = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
            self.reply(body)
        finally:
            with srv.lock:
                srv.inflight -= 1


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.models, srv.delay, srv.usage = ["only-model"], 0.0, True
    srv.lock, srv.inflight, srv.peak, srv.seen = threading.Lock(), 0, 0, []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "FSM_MODEL", "FSM_HTTP_TIMEOUT",
                 "FSM_LLM_CONCURRENCY", "FSM_LLM", "FSM_JSON_MODE"):
        monkeypatch.delenv(name, raising=False)


def base(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/v1"


def complete_many(provider: OpenAICompatible, n: int, **kw: Any) -> list[Any]:
    async def go() -> list[Any]:
        try:
            return await asyncio.gather(*[provider.complete(MSG, **kw) for _ in range(n)],
                                        return_exceptions=True)
        finally:
            await provider.aclose()
    return asyncio.run(go())


# -- the model -----------------------------------------------------------------------------

def test_the_servers_only_model_is_used(server: ThreadingHTTPServer) -> None:
    provider = OpenAICompatible(base_url=base(server))
    (done,) = complete_many(provider, 1)
    assert done.model == "only-model" and server.seen == ["only-model"]
    assert provider.model == "only-model" and "only-model" in provider.describe()


def test_several_models_need_a_choice(server: ThreadingHTTPServer) -> None:
    server.models = ["a-model", "b-model"]
    (err,) = complete_many(OpenAICompatible(base_url=base(server)), 1)
    assert isinstance(err, ClientError) and "a-model, b-model" in str(err)
    assert "FSM_MODEL" in str(err) and server.seen == []
    with pytest.raises(ClientError, match="lists 2 models"):
        OpenAICompatible(base_url=base(server)).resolve_model_sync()
    assert OpenAICompatible(base_url=base(server), model="b-model").resolve_model_sync() == "b-model"


def test_the_openai_api_needs_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with pytest.raises(ClientError, match="FSM_MODEL"):
        OpenAICompatible()
    monkeypatch.setenv("FSM_MODEL", "gpt-x")
    assert OpenAICompatible().model == "gpt-x"


# -- concurrency ------------------------------------------------------------------------------

def test_a_loopback_server_gets_one_request_at_a_time(server: ThreadingHTTPServer) -> None:
    server.delay = 0.1
    provider = OpenAICompatible(base_url=base(server), model="m")
    assert provider.concurrency == 1
    results = complete_many(provider, 4)
    assert all(r.text for r in results) and server.peak == 1


def test_the_limit_is_configurable(server: ThreadingHTTPServer,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    server.delay = 0.2
    complete_many(OpenAICompatible(base_url=base(server), model="m", concurrency=3), 6)
    assert server.peak == 3
    monkeypatch.setenv("FSM_LLM_CONCURRENCY", "2")
    assert OpenAICompatible(base_url=base(server), model="m").concurrency == 2
    monkeypatch.setenv("FSM_LLM_CONCURRENCY", "zero")
    with pytest.raises(InvalidInput, match="FSM_LLM_CONCURRENCY"):
        OpenAICompatible(base_url=base(server), model="m")


def test_loopback_detection() -> None:
    assert all(map(is_loopback, ["http://127.0.0.1:8080/v1", "http://localhost/v1",
                                 "http://[::1]:9/v1", "http://127.3.4.5/v1"]))
    assert not any(map(is_loopback, ["https://api.openai.com/v1", "http://10.0.0.2/v1", None]))
    assert OpenAICompatible(base_url="http://10.0.0.2/v1", model="m").concurrency == 16


# -- timeouts --------------------------------------------------------------------------------

def test_fsm_http_timeout_and_the_per_call_timeout(server: ThreadingHTTPServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    server.delay = 0.6
    monkeypatch.setenv("FSM_HTTP_TIMEOUT", "0.2")
    (err,) = complete_many(OpenAICompatible(base_url=base(server), model="m"), 1)
    assert isinstance(err, ProviderTimeout) and "timed out after 0.2s" in str(err)
    (done,) = complete_many(OpenAICompatible(base_url=base(server), model="m"), 1, timeout=5)
    assert done.text


class Ctx(BaseModel):
    text: str = ""


async def ask(ctx: Ctx, step) -> dict:
    return {"text": (await step.llm.complete(MSG)).text}


TIMED = Machine(name="timed", context=Ctx, initial="ask",
                states=[State("ask", action=ask, timeout=5.0), State("done", final=True),
                        State("failed", final=True, failure=True)],
                transitions=[Transition("ok", "ask", "done")])


def test_the_http_timeout_follows_the_states(server: ThreadingHTTPServer, db_path: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's own timeout (0.2 s) is shorter than the reply (0.6 s); the state's
    5 s timeout is what the request gets."""
    server.delay = 0.6
    monkeypatch.setenv("FSM_HTTP_TIMEOUT", "0.2")
    provider = OpenAICompatible(base_url=base(server))
    eng = Engine(db_path, llm=provider)

    async def go() -> Any:
        try:
            return await eng.run(eng.start(TIMED, {}))
        finally:
            await provider.aclose()
    rec = asyncio.run(go())
    assert (rec.status, rec.context["text"]) == ("completed", "four words of reply")
    (call,) = eng.store.history(rec.id)[0].detail["llm_calls"]
    assert call["model"] == "openai:only-model" and "usage_missing" not in call
    eng.close()


# -- usage -------------------------------------------------------------------------------------

def test_a_reply_without_usage_is_flagged_and_estimated(server: ThreadingHTTPServer,
                                                        db_path: str) -> None:
    server.usage = False
    provider = OpenAICompatible(base_url=base(server), model="m")
    eng = Engine(db_path, llm=provider)

    async def go() -> Any:
        try:
            return await eng.run(eng.start(TIMED, {}))
        finally:
            await provider.aclose()
    rec = asyncio.run(go())
    (call,) = eng.store.history(rec.id)[0].detail["llm_calls"]
    expected = provider.count_tokens(MSG) + estimate_tokens("four words of reply")
    assert call["usage_missing"] is True and call["tokens"] == expected > 0
    assert rec.tokens_used == expected
    eng.close()


# -- fsm run's header ----------------------------------------------------------------------------

def test_fsm_run_names_the_model_in_its_header(server: ThreadingHTTPServer, tmp_path: Path,
                                               db_path: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", base(server))
    module = tmp_path / "timed.py"
    module.write_text("from test_llm_operators import TIMED as machine\n")
    source = tmp_path / "in.json"
    source.write_text("{}")
    result = CliRunner().invoke(app, ["run", str(module), "--input", str(source),
                                      "--db", db_path, "--llm", "openai"])
    assert result.exit_code == 0, result.output
    assert "model 'only-model'" in result.stderr and "1 request(s) at a time" in result.stderr
    server.models = ["x", "y"]
    result = CliRunner().invoke(app, ["run", str(module), "--input", str(source),
                                      "--db", db_path, "--llm", "openai"])
    assert result.exit_code != 0 and "lists 2 models" in str(result.exception or result.output)
    assert len(Engine(db_path).store.list()) == 1  # the refused run created no instance
