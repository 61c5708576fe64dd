"""OpenAICompatible against a real (stdlib) HTTP server: error mapping and key hygiene.

The fake server picks its behaviour from the request's ``model`` field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fsm_engine.errors import ClientError, InvalidInput, ProviderTimeout, ProviderUnavailable, RateLimited, ServerError
from fsm_engine.llm import OpenAICompatible
from fsm_engine.llm.openai_compat import parse_retry_after

KEY = "sk-test-SECRET-0123456789abcdef"
MSG = [{"role": "user", "content": "hi"}]


def completion_body(model: str, content: str) -> dict:
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def reply(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # client gave up
            self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - http.server API
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(({k.lower(): v for k, v in self.headers.items()}, request))
        model = request["model"]
        echo = {"error": {"message": f"bad key {self.headers.get('Authorization')}"}}
        fmt = (request.get("response_format") or {}).get("type")
        if model == "llamacpp" and fmt == "json_schema":  # what llama_cpp.server answers
            self.reply(500, {"error": {"message": "Input should be 'text' or 'json_object', "
                                                  "input: 'json_schema'"}})
        elif model in ("ok", "llamacpp"):
            self.reply(200, completion_body("served-model", '{"a": 1}'))
        elif model.startswith("rate-"):
            self.rate_limited(model)
        elif model in ERRORS:
            status, body = ERRORS[model]
            self.reply(status, echo if body is None else body)
        elif model == "slow":
            time.sleep(1.5)
            self.reply(200, completion_body(model, "late"))
        else:
            self.reply(404, {"error": {"message": f"no model {model}"}})

    def rate_limited(self, model):
        """429, with a Retry-After in seconds, as an HTTP date, or none."""
        headers = {"rate-seconds": {"Retry-After": "7"},
                   "rate-date": {"Retry-After": formatdate(time.time() + 30, usegmt=True)}}
        self.reply(429, {"error": {"message": "slow down"}}, headers.get(model, {}))


#: model -> (status, body; None: the echo of the Authorization header)
ERRORS = {"server": (500, None), "gateway": (503, {"error": {"message": "overloaded"}}),
          "bad": (400, None), "auth": (401, None)}


@pytest.fixture(scope="module")
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def call(server, model: str, **kwargs):
    async def go():
        provider = OpenAICompatible(base_url=url(server), model=model, api_key=KEY, timeout=0.5)
        try:
            return await provider.complete(MSG, **kwargs)
        finally:
            await provider.aclose()

    return asyncio.run(go())


def test_success_reports_usage_and_sends_options(fake_server):
    schema = {"title": "Answer", "type": "object", "properties": {"a": {"type": "integer"}}}
    done = call(fake_server, "ok", max_tokens=17, json_schema=schema, stop=["END"])
    assert (done.text, done.prompt_tokens, done.completion_tokens) == ('{"a": 1}', 11, 3)
    assert done.finish_reason == "stop" and done.model == "served-model"
    headers, body = fake_server.requests[-1]
    assert headers["authorization"] == f"Bearer {KEY}"
    assert body["max_tokens"] == 17 and body["stop"] == ["END"] and body["temperature"] == 0.0
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "Answer", "schema": schema}}


@pytest.mark.parametrize("model, low, high", [
    ("rate-seconds", 7, 7), ("rate-date", 25, 31)])
def test_429_maps_to_rate_limited_with_retry_after(fake_server, model, low, high):
    with pytest.raises(RateLimited) as info:
        call(fake_server, model)
    assert info.value.status == 429 and info.value.retryable
    assert low <= info.value.retry_after <= high


def test_429_without_header_has_no_retry_after(fake_server):
    with pytest.raises(RateLimited) as info:
        call(fake_server, "rate-none")
    assert info.value.retry_after is None


@pytest.mark.parametrize("model, cls, status", [
    ("server", ServerError, 500), ("gateway", ServerError, 503),
    ("bad", ClientError, 400), ("auth", ClientError, 401), ("nope", ClientError, 404)])
def test_status_codes_map_and_never_leak_the_key(fake_server, model, cls, status):
    with pytest.raises(cls) as info:
        call(fake_server, model)
    err = info.value
    assert err.status == status and err.retryable is (status >= 500)
    assert KEY not in str(err) and KEY not in repr(err) and err.__cause__ is None
    if model in ("server", "bad", "auth"):
        assert "Bearer ***" in str(err)  # the server echoed the key; we masked it


def test_slow_response_is_a_timeout(fake_server):
    started = time.perf_counter()
    with pytest.raises(ProviderTimeout) as info:
        call(fake_server, "slow")
    assert time.perf_counter() - started < 1.4
    assert info.value.retryable and KEY not in str(info.value)


def test_connection_refused_is_unavailable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the call: nothing listens

    async def go():
        provider = OpenAICompatible(base_url=f"http://127.0.0.1:{port}/v1", model="m",
                                    api_key=KEY, timeout=2.0)
        try:
            await provider.complete(MSG)
        finally:
            await provider.aclose()

    with pytest.raises(ProviderUnavailable) as info:
        asyncio.run(go())
    assert info.value.retryable and KEY not in str(info.value)


def test_repr_and_config_from_env(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("FSM_MODEL", "env-model")
    provider = OpenAICompatible()
    assert (provider.base_url, provider.model) == ("http://127.0.0.1:9/v1", "env-model")
    assert KEY not in repr(provider) and KEY not in str(vars(provider).get("base_url"))
    monkeypatch.delenv("OPENAI_API_KEY")
    assert OpenAICompatible()._client.api_key == "sk-no-key"
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ClientError, match="OPENAI_API_KEY"):
        OpenAICompatible()


def test_parse_retry_after_forms():
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": formatdate(1000.0, usegmt=True)}, now=990.0) == 10.0
    assert parse_retry_after({"retry-after": formatdate(1000.0, usegmt=True)}, now=2000.0) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_auto_json_mode_falls_back_to_llama_cpp_form_once(fake_server):
    async def go():
        provider = OpenAICompatible(base_url=url(fake_server), model="llamacpp", api_key=KEY)
        first = await provider.complete(MSG, json_schema=SCHEMA)
        mode = provider.json_mode
        await provider.complete(MSG, json_schema=SCHEMA)
        await provider.aclose()
        return first, mode

    before = len(fake_server.requests)
    first, mode = asyncio.run(go())
    sent = [body.get("response_format") for _, body in fake_server.requests[before:]]
    assert first.text == '{"a": 1}' and mode == "json_object"
    assert [f["type"] for f in sent] == ["json_schema", "json_object", "json_object"]
    assert sent[1] == {"type": "json_object", "schema": SCHEMA}


def test_fixed_json_modes(fake_server):
    with pytest.raises(ServerError):
        asyncio.run(OpenAICompatible(base_url=url(fake_server), model="llamacpp", api_key=KEY,
                                     json_mode="json_schema").complete(MSG, json_schema=SCHEMA))
    asyncio.run(OpenAICompatible(base_url=url(fake_server), model="ok", api_key=KEY,
                                 json_mode="off").complete(MSG, json_schema=SCHEMA))
    assert "response_format" not in fake_server.requests[-1][1]
    with pytest.raises(InvalidInput, match="json_mode"):
        OpenAICompatible(base_url=url(fake_server), api_key=KEY, json_mode="xml")


def test_debug_logs_never_contain_the_key(fake_server, caplog):
    caplog.set_level(logging.DEBUG)
    call(fake_server, "ok")
    with pytest.raises(ClientError):
        call(fake_server, "auth")
    assert caplog.records  # the SDK and httpx did log at DEBUG
    assert all(KEY not in record.getMessage() for record in caplog.records)
