"""Every HTTP call has a response byte cap and an overall deadline; certificate errors fail at once.

Against real loopback peers (``http_peers``): an endless 200 body, a reply sent one byte per
second, a 10 GB Content-Length, a TLS server with a self-signed certificate.  Each test
asserts the bound (bytes the peer got to send, time, memory) and the error kind, through the
OpenAI-compatible provider and the webhook sink alike.  Time bounds leave 2 s of slack for
a loaded machine; unbounded code takes the 20 s after which a slow peer gives up.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import http_peers
import pytest
from http_peers import Peer
from pydantic import BaseModel

from fsm_engine import Machine, State, Step, Transition
from fsm_engine.errors import ProviderError, ProviderTimeout
from fsm_engine.llm import OpenAICompatible
from fsm_engine.policies import Disposition, RetryPolicy, classify
from fsm_engine.sinks import post_webhook

KEY = "sk-test-SECRET-0123456789abcdef"
MSG = [{"role": "user", "content": "hi"}]
MiB = 1024 * 1024
#: what the kernel's loopback socket buffers hold beyond what the client read
IN_FLIGHT = 24 * MiB


@pytest.fixture
def peer(request: pytest.FixtureRequest) -> Iterator[Peer]:
    served = Peer(getattr(http_peers, request.param))
    yield served
    served.close()


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return http_peers.self_signed(tmp_path_factory.mktemp("tls"))


def complete(url: str, timeout: float | None = None, **kwargs: Any) -> tuple[Any, float]:
    """One provider call; (the exception raised or the completion, seconds taken)."""
    async def go() -> Any:
        provider = OpenAICompatible(base_url=f"{url}/v1", model="m", api_key=KEY, **kwargs)
        try:
            return await provider.complete(MSG, timeout=timeout)
        except ProviderError as exc:
            return exc
        finally:
            await provider.aclose()
    started = time.monotonic()
    out = asyncio.run(go())
    return out, time.monotonic() - started


def webhook(url: str, timeout: float = 10.0) -> tuple[Any, float]:
    started = time.monotonic()
    try:
        out: Any = post_webhook(f"{url}/hook", {"n": 1}, "k-1", timeout=timeout)
    except ProviderError as exc:
        out = exc
    return out, time.monotonic() - started


# -- the byte cap ----------------------------------------------------------------------------

@pytest.mark.parametrize("peer", ["endless"], indirect=True)
def test_an_endless_body_is_cut_at_the_cap_and_fails_at_once(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_HTTP_MAX_BYTES", str(2 * MiB))
    err, took = complete(peer.url, timeout=60)
    assert type(err).__name__ == "ResponseTooLarge", err
    assert "2097152 bytes" in str(err) and "FSM_HTTP_MAX_BYTES" in str(err)
    assert classify(err) is Disposition.FAIL  # the same peer would send the same again
    assert peer.sent < 2 * MiB + IN_FLIGHT, peer.sent
    assert took < 10


@pytest.mark.parametrize("peer", ["huge_length"], indirect=True)
def test_a_declared_length_over_the_cap_is_refused_before_the_body(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_HTTP_MAX_BYTES", str(MiB))
    err, took = complete(peer.url, timeout=60)
    assert type(err).__name__ == "ResponseTooLarge", err
    assert "10000000000" in str(err)
    assert took < 3.0  # the peer sends its 12 MiB over 10 s: none of it was waited for


@pytest.mark.parametrize("peer", ["endless"], indirect=True)
def test_peak_memory_stays_bounded_by_the_cap(peer: Peer, tmp_path: Path) -> None:
    """Peak RSS of a process calling an endless peer, with an 8 MiB cap."""
    script = tmp_path / "call.py"
    script.write_text(
        "import asyncio, json, resource, sys\n"
        "from fsm_engine.llm import OpenAICompatible\n"
        "def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
        "async def go():\n"
        f"    p = OpenAICompatible(base_url=sys.argv[1], model='m', api_key={KEY!r})\n"
        "    warm = OpenAICompatible(base_url='http://127.0.0.1:1/v1', model='m', api_key='k')\n"
        "    try:\n"
        "        await warm.complete([{'role': 'user', 'content': 'warm'}], timeout=5)\n"
        "    except Exception:\n"
        "        pass\n"
        "    before = rss()\n"
        "    try:\n"
        "        await p.complete([{'role': 'user', 'content': 'hi'}], timeout=60)\n"
        "        kind = 'none'\n"
        "    except Exception as exc:\n"
        "        kind = type(exc).__name__\n"
        "    print(json.dumps({'before': before, 'after': rss(), 'kind': kind}))\n"
        "asyncio.run(go())\n")
    env = {**os.environ, "FSM_HTTP_MAX_BYTES": str(8 * MiB)}
    out = subprocess.run([sys.executable, str(script), f"{peer.url}/v1"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    growth = (got["after"] - got["before"]) / MiB
    print(f"peak RSS {got['before'] / MiB:.1f} -> {got['after'] / MiB:.1f} MiB "
          f"(growth {growth:.1f} MiB), peer sent {peer.sent / MiB:.1f} MiB")
    assert got["kind"] == "ResponseTooLarge"
    assert growth < 64, growth  # unbounded: 256 MiB and more


@pytest.mark.parametrize("peer", ["gzipped"], indirect=True)
def test_a_compressed_reply_is_refused_as_its_decoded_size_is_unbounded(peer: Peer) -> None:
    err, _ = complete(peer.url, timeout=10)
    assert type(err).__name__ == "ResponseTooLarge" and "gzip" in str(err), err
    assert b"accept-encoding: identity" in peer.requests[0].lower()


@pytest.mark.parametrize("peer", ["endless"], indirect=True)
def test_the_webhook_reads_no_body_it_does_not_need(peer: Peer) -> None:
    out, took = webhook(peer.url)
    assert out == {"sink": "webhook", "status": 200}
    assert peer.sent < IN_FLIGHT and took < 5, (peer.sent, took)


# -- the overall deadline --------------------------------------------------------------------

@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_one_byte_per_second_is_cut_at_the_http_timeout(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_HTTP_TIMEOUT", "2")
    err, took = complete(peer.url)
    assert type(err).__name__ == "DeadlineExceeded", err
    assert isinstance(err, ProviderTimeout) and classify(err) is Disposition.RETRY
    assert "2s" in str(err)
    assert 1.8 < took < 4.0, took  # connect + headers + body: one deadline


@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_fsm_http_deadline_bounds_the_whole_call(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_HTTP_TIMEOUT", "30")
    monkeypatch.setenv("FSM_HTTP_DEADLINE", "1.5")
    err, took = complete(peer.url)
    assert type(err).__name__ == "DeadlineExceeded", err
    assert 1.3 < took < 3.5, took


@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_what_is_left_of_the_step_timeout_bounds_the_call(peer: Peer) -> None:
    err, took = complete(peer.url, timeout=1.2)
    assert isinstance(err, ProviderTimeout), err
    assert 1.0 < took < 3.2, took


@pytest.mark.parametrize("peer", ["slow_body"], indirect=True)
def test_a_body_sent_one_byte_per_second_is_cut_at_the_deadline(peer: Peer) -> None:
    err, took = complete(peer.url, timeout=1.5)
    assert type(err).__name__ == "DeadlineExceeded", err
    assert "body bytes read" in str(err) and 1.3 < took < 3.5, (err, took)


@pytest.mark.parametrize("peer", ["mute"], indirect=True)
def test_the_deadline_covers_a_tls_handshake_that_never_ends(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSM_HTTP_DEADLINE", "1.5")
    url = peer.url.replace("http://", "https://")
    err, took = complete(url)
    assert type(err).__name__ == "DeadlineExceeded", err
    assert 1.3 < took < 3.5, took


@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_proxies_from_the_environment_are_bounded_too(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from fsm_engine.llm.http import client_options
    monkeypatch.setenv("HTTP_PROXY", peer.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def get() -> None:
        async with httpx.AsyncClient(**client_options(httpx)) as client:
            await client.get("http://198.51.100.1/never", timeout=1.5)  # TEST-NET: only the proxy
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        asyncio.run(get())
    assert type(caught.value).__name__ == "DeadlineExceeded", caught.value
    assert time.monotonic() - started < 3.5
    assert peer.requests[0].startswith(b"GET http://198.51.100.1/never")


@pytest.mark.parametrize("peer", ["trickle"], indirect=True)
def test_the_webhook_deadline_covers_a_trickled_head(peer: Peer) -> None:
    err, took = webhook(peer.url, timeout=1.5)
    assert type(err).__name__ == "DeadlineExceeded", err
    assert 1.3 < took < 3.5, took


def test_malformed_caps_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from fsm_engine.errors import InvalidInput
    monkeypatch.setenv("FSM_HTTP_MAX_BYTES", "lots")
    with pytest.raises(InvalidInput, match="FSM_HTTP_MAX_BYTES"):
        OpenAICompatible(base_url="http://127.0.0.1:9/v1", model="m")


# -- certificates ----------------------------------------------------------------------------

def test_a_self_signed_certificate_fails_the_provider_at_once(cert: tuple[str, str]) -> None:
    peer = Peer(http_peers.ok, tls=cert)
    try:
        err, _ = complete(peer.url, timeout=10)
    finally:
        peer.close()
    assert type(err).__name__ == "CertificateError", err
    assert "certificate" in str(err).lower() and classify(err) is Disposition.FAIL
    assert peer.connections == 1


def test_a_self_signed_certificate_fails_the_webhook_at_once(cert: tuple[str, str]) -> None:
    peer = Peer(http_peers.ok, tls=cert)
    try:
        err, _ = webhook(peer.url)
    finally:
        peer.close()
    assert type(err).__name__ == "CertificateError", err
    assert classify(err) is Disposition.FAIL and peer.connections == 1 and not peer.sent


@pytest.mark.parametrize("client", ["httpx", "requests", "urllib"])
def test_an_action_meeting_a_bad_certificate_is_not_retried(
        client: str, cert: tuple[str, str]) -> None:
    """classify() sees the certificate error however the action's library wraps it."""
    peer = Peer(http_peers.ok, tls=cert)
    try:
        with pytest.raises(Exception) as caught:
            if client == "httpx":
                import httpx
                httpx.get(peer.url, timeout=5)
            elif client == "requests":
                import requests
                requests.get(peer.url, timeout=5)
            else:
                import urllib.request
                urllib.request.urlopen(peer.url, timeout=5)
    finally:
        peer.close()
    assert classify(caught.value) is Disposition.FAIL, repr(caught.value)


class Ctx(BaseModel):
    answer: str = ""


async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
    return {"answer": (await step.llm.complete(MSG)).text}


ASK = Machine("ask", context=Ctx, initial="ask", states=[
    State("ask", action=ask, retry=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=0)),
    State("done", final=True)], transitions=[Transition("next", "ask", "done")])


def test_a_certificate_error_is_not_retried_by_the_engine(
        engine_factory: Any, cert: tuple[str, str]) -> None:
    peer = Peer(http_peers.ok, tls=cert)
    try:
        engine = engine_factory(llm=OpenAICompatible(base_url=f"{peer.url}/v1", model="m",
                                                     api_key=KEY))
        rec = asyncio.run(engine.run(engine.start(ASK, {})))
        attempts = engine.store.attempts(rec.id)
    finally:
        peer.close()
    assert rec.status == "failed", rec
    assert peer.connections == 1 and len(attempts) <= 1, (peer.connections, attempts)
    assert "certificate" in (rec.last_error or rec.reason or "").lower(), rec


# -- the model listing (a command's header, no event loop) -----------------------------------

def test_the_sync_model_listing_is_bounded_and_still_answers() -> None:
    def models(conn: Any, request: bytes, peer: Peer) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "only-one"}]}).encode()
        peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode()
                  + b"\r\n\r\n" + body)
    listing, slow = Peer(models), Peer(http_peers.trickle)
    try:
        assert OpenAICompatible(base_url=f"{listing.url}/v1").resolve_model_sync() == "only-one"
        started = time.monotonic()
        with pytest.raises(ProviderTimeout):
            OpenAICompatible(base_url=f"{slow.url}/v1", timeout=1.5).resolve_model_sync()
        assert time.monotonic() - started < 3.5
    finally:
        listing.close()
        slow.close()


# -- public API only ---------------------------------------------------------------------------

#: a named tuple's public methods (``urlsplit(...)._replace``): underscored to miss its fields
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


def test_the_bounds_touch_no_private_part_of_httpx_or_the_sdk() -> None:
    """llm/http.py, sinks.py and the provider reach httpx/httpx2 and openai through their
    public API only: no ``x._name`` on anything but ``self``, no private module imported."""
    import ast

    import fsm_engine
    root = Path(fsm_engine.__file__).parent
    found = []
    for name in ("llm/http.py", "sinks.py", "llm/openai_compat.py"):
        tree = ast.parse((root / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and node.attr not in NAMEDTUPLE_API \
                    and ast.unparse(node.value) != "self":
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and any(
                    part.startswith("_") and not part.startswith("__")
                    for part in (node.module or "").split(".")):
                found.append(f"{name}:{node.lineno}: from {node.module}")
    assert found == []


def test_proxies_of_the_environment_follow_httpx_rules() -> None:
    from fsm_engine.llm.http import env_proxies
    env = {"HTTP_PROXY": "proxy.corp:3128", "https_proxy": "http://p:1",
           "NO_PROXY": "localhost, 10.0.0.1,::1,.internal,http://direct.example"}
    assert env_proxies(env) == {
        "http://": "http://proxy.corp:3128", "https://": "http://p:1",
        "all://localhost": None, "all://10.0.0.1": None, "all://[::1]": None,
        "all://*.internal": None, "http://direct.example": None}
    assert env_proxies({"ALL_PROXY": "http://p:2", "NO_PROXY": "*"}) == {}
