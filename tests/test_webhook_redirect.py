"""The webhook: only a 2xx is a delivery; a 3xx is a failed attempt naming the status and
Location, and the redirect is never followed (the notification is not sent elsewhere).

Real loopback peers (``http_peers``), a real engine on both store backends.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import http_peers
import pytest
from http_peers import Peer
from pydantic import BaseModel

from fsm_engine import Machine, State, Step, Transition
from fsm_engine.errors import ProviderError
from fsm_engine.policies import Disposition, RetryPolicy, classify
from fsm_engine.sinks import post_webhook


@pytest.fixture
def target() -> Iterator[Peer]:
    """Where the redirect points: it must never be asked."""
    peer = Peer(http_peers.ok)
    yield peer
    peer.close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_delivery_naming_status_and_location(
        status: int, target: Peer) -> None:
    location = f"{target.url}/elsewhere?x=1"
    peer = Peer(http_peers.redirect(location, status))
    try:
        with pytest.raises(ProviderError) as caught:
            post_webhook(f"{peer.url}/hook", {"n": 1}, "k-1")
    finally:
        peer.close()
    err = caught.value
    assert f"HTTP {status}" in str(err) and location in str(err), str(err)
    assert "not followed" in str(err) and err.status == status
    assert classify(err) is Disposition.FAIL
    assert target.connections == 0 and len(peer.requests) == 1


def test_a_hostile_location_is_shown_as_one_short_line(target: Peer) -> None:
    location = "http://user:pw@evil.example/" + "a" * 5000 + "\x1b[31m"
    peer = Peer(http_peers.redirect(location.replace("\x1b", "%1b"), 302))
    try:
        with pytest.raises(ProviderError) as caught:
            post_webhook(f"{peer.url}/hook", {"n": 1}, "k-1")
    finally:
        peer.close()
    text = str(caught.value)
    assert "pw@" not in text and len(text) < 400 and "\x1b" not in text, text


def test_a_location_that_is_no_url_is_no_delivery_either() -> None:
    """httpx itself refuses it (a RemoteProtocolError, before any status is seen)."""
    peer = Peer(http_peers.redirect("http://[::1/x", 302))
    try:
        with pytest.raises(ProviderError, match="RemoteProtocolError"):
            post_webhook(f"{peer.url}/hook", {"n": 1}, "k-1")
    finally:
        peer.close()


@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_a_2xx_is_a_delivery(status: int) -> None:
    def answer(conn: Any, request: bytes, peer: Peer) -> None:
        peer.send(conn, f"HTTP/1.1 {status} Fine\r\nContent-Length: 0\r\n\r\n".encode())
    peer = Peer(answer)
    try:
        assert post_webhook(f"{peer.url}/hook", {"n": 1}, "k-1") == {"sink": "webhook",
                                                                      "status": status}
    finally:
        peer.close()


class Ctx(BaseModel):
    n: int = 1
    delivery: dict[str, Any] = {}


def notify(ctx: Ctx, step: Step) -> dict[str, Any]:
    return {"delivery": post_webhook(os.environ["REDIRECT_SINK_URL"], {"n": ctx.n},
                                     step.idempotency_key)}


NOTIFY = Machine("notify", context=Ctx, initial="notify", states=[
    State("notify", action=notify, side_effect=True,
          retry=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=0)),
    State("done", final=True)], transitions=[Transition("next", "notify", "done")])


def test_the_engine_records_a_302_as_a_failed_attempt_not_a_delivery(
        engine_factory: Any, target: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    location = f"{target.url}/moved"
    peer = Peer(http_peers.redirect(location, 302))
    monkeypatch.setenv("REDIRECT_SINK_URL", f"{peer.url}/hook")
    try:
        engine = engine_factory()
        rec = asyncio.run(engine.run(engine.start(NOTIFY, {})))
        outbox = engine.store.outbox(rec.id)
    finally:
        peer.close()
    assert rec.status == "failed", rec
    assert "HTTP 302" in (rec.last_error or "") and location in (rec.last_error or ""), rec
    assert [row.status for row in outbox] != ["done"], outbox
    assert all(row.result is None for row in outbox), outbox
    assert len(peer.requests) == 1 and target.connections == 0  # not retried, not followed
