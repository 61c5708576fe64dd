"""Deliver a side effect outside the database: an HTTP webhook or a JSONL file.

Both carry the step's idempotency key so the receiver can drop a repeat
(a repeat happens only when a process died after delivering and before the
step's commit; see ``Engine`` side effects).  Webhook failures raise the
same errors as providers, so retry policies classify them alike:
connection errors, timeouts and 5xx retry, 429 honours ``Retry-After``, other 4xx fail.
Only a 2xx is a delivery: a redirect (3xx) is not followed — the notification must not
go to an address its sender did not configure — and fails, naming the status and the
``Location``.  The client is bounded (``fsm_engine.llm.http``): one deadline for the
whole exchange (the ``timeout``, capped by ``FSM_HTTP_DEADLINE``), at most
:data:`BODY_BYTES` of a reply read, certificate errors failing at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit

import httpx

from .errors import (
    ClientError,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    ServerError,
)
from .llm.http import client_options

#: the most of a webhook's reply body read (only its status counts); a longer one is cut
#: and its connection closed, a shorter one read whole so the connection is reused
BODY_BYTES = 64 * 1024

class _Courier:
    """This process's webhook client, shared by every thread: its connections and TLS
    context are reused (``httpx.post`` built a new client, and loaded the CA bundle, per
    call: about a third of a worker's CPU in ``bench/scale_out.py``).  It is an
    ``httpx.AsyncClient`` on an event loop of its own (a daemon thread), since the bounds
    of ``llm.http`` hold on an event loop only; a caller's thread waits for its post."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(**client_options(httpx))
        threading.Thread(target=self.loop.run_forever, name="fsm-webhook", daemon=True).start()

    def run(self, post: Coroutine[Any, Any, httpx.Response]) -> httpx.Response:
        return asyncio.run_coroutine_threadsafe(post, self.loop).result()


_couriers: dict[int, _Courier] = {}  # pid -> the process's courier (a fork makes its own)
_couriers_lock = threading.Lock()


def _courier() -> _Courier:
    pid = os.getpid()
    courier = _couriers.get(pid)
    if courier is None:
        with _couriers_lock:
            courier = _couriers.get(pid)
            if courier is None:
                courier = _couriers[pid] = _Courier()
    return courier


def post_webhook(url: str, payload: dict[str, Any], key: str, *,
                 timeout: float = 10.0) -> dict[str, Any]:
    """POST ``payload`` as JSON with header ``Idempotency-Key: key``; return ``{"sink", "status"}``
    for a 2xx answer.  ``timeout``: seconds for the whole exchange.

    Raises ProviderTimeout (DeadlineExceeded past the deadline), ProviderUnavailable,
    CertificateError, RateLimited (429), ServerError (5xx) or ClientError (a 3xx, not
    followed, or another 4xx)."""
    courier = _courier()

    async def post() -> httpx.Response:
        async with courier.client.stream("POST", url, json=payload, timeout=timeout,
                                         headers={"Idempotency-Key": key}) as resp:
            await _drain(resp)
        return resp
    try:
        resp = courier.run(post())
    except ProviderError:
        raise
    except httpx.TimeoutException as exc:
        raise ProviderTimeout(f"webhook timed out: {type(exc).__name__}") from None
    except httpx.TransportError as exc:
        raise ProviderUnavailable(f"webhook unreachable: {type(exc).__name__}") from None
    return _outcome(resp)


async def _drain(resp: httpx.Response) -> None:
    """Read at most :data:`BODY_BYTES` of the reply."""
    read = 0
    async for chunk in resp.aiter_raw():
        read += len(chunk)
        if read > BODY_BYTES:
            return


def _outcome(resp: httpx.Response) -> dict[str, Any]:
    """The delivery a 2xx answer is; the error any other status is."""
    code = resp.status_code
    if 200 <= code < 300:
        return {"sink": "webhook", "status": code}
    if code == 429:
        after = resp.headers.get("retry-after")
        raise RateLimited("webhook rate limited", status=code,
                          retry_after=float(after) if after and after.isdigit() else None)
    if code >= 500:
        raise ServerError(f"webhook answered HTTP {code}", status=code)
    if code >= 400:
        raise ClientError(f"webhook answered HTTP {code}", status=code)
    where = _shown(resp.headers.get("location", ""))
    raise ClientError(f"webhook answered HTTP {code} (redirect to {where or 'nowhere'}): "
                      "not followed, not delivered (only a 2xx is a delivery)", status=code)


def _shown(location: str, limit: int = 200) -> str:
    """A peer's ``Location`` as one short printable line, without any user:password@."""
    try:
        parts = urlsplit(location)
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    except ValueError:  # not a URL (e.g. "http://[::1"): shown as text, any "@" cut
        shown = location.rpartition("@")[2]
    text = "".join(ch if ch.isprintable() else "?" for ch in shown)
    return text if len(text) <= limit else text[:limit] + "..."


def _delivered(path: str, key: str) -> bool:
    """True when a line with this idempotency key is already in the file."""
    needle = json.dumps({"idempotency_key": key}, ensure_ascii=False)[1:-1]
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return any(line.startswith("{" + needle) for line in fh)
    except FileNotFoundError:
        return False


def append_jsonl(path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
    """Append ``{"idempotency_key": key, **payload}`` as one line and fsync it, unless a
    line with this key is already there (a retry after a crash): the file sink is its own
    deduplicating receiver, so each key appears once."""
    if _delivered(path, key):
        return {"sink": "file", "path": path, "duplicate": True}
    line = json.dumps({"idempotency_key": key, **payload}, ensure_ascii=False) + "\n"
    with open(path, "a", encoding="utf-8", errors="backslashreplace") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    return {"sink": "file", "path": path}


def deliver(payload: dict[str, Any], key: str) -> dict[str, Any]:
    """Send to ``FSM_NOTIFY_URL`` when set, else append to ``FSM_NOTIFY_FILE``
    (default ``notifications.jsonl`` in the working directory)."""
    url = os.environ.get("FSM_NOTIFY_URL")
    if url:
        return post_webhook(url, payload, key)
    return append_jsonl(os.environ.get("FSM_NOTIFY_FILE", "notifications.jsonl"), payload, key)
