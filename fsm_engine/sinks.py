"""Deliver a side effect outside the database: an HTTP webhook or a JSONL file.

Both carry the step's idempotency key so the receiver can drop a repeat
(a repeat happens only when a process died after delivering and before the
step's commit; see ``Engine`` side effects).  Webhook failures raise the
same errors as providers, so retry policies classify them alike:
connection errors and 5xx retry, 429 honours ``Retry-After``, other 4xx fail.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import httpx

from .errors import ClientError, ProviderTimeout, ProviderUnavailable, RateLimited, ServerError

_clients: dict[int, httpx.Client] = {}  # pid -> the process's client (a fork makes its own)
_clients_lock = threading.Lock()


def _client() -> httpx.Client:
    """This process's webhook client, shared by every thread: its connections and TLS
    context are reused (``httpx.post`` built a new client, and loaded the CA bundle,
    per call: about a third of a worker's CPU in ``bench/scale_out.py``)."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        with _clients_lock:
            client = _clients.get(pid)
            if client is None:
                client = _clients[pid] = httpx.Client()
    return client


def post_webhook(url: str, payload: dict[str, Any], key: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """POST ``payload`` as JSON with header ``Idempotency-Key: key``; return ``{"sink", "status"}``."""
    try:
        resp = _client().post(url, json=payload, headers={"Idempotency-Key": key},
                              timeout=timeout)
    except httpx.TimeoutException as exc:
        raise ProviderTimeout(f"webhook timed out: {type(exc).__name__}") from None
    except httpx.TransportError as exc:
        raise ProviderUnavailable(f"webhook unreachable: {type(exc).__name__}") from None
    code = resp.status_code
    if code == 429:
        after = resp.headers.get("retry-after")
        raise RateLimited("webhook rate limited", status=code,
                          retry_after=float(after) if after and after.isdigit() else None)
    if code >= 500:
        raise ServerError(f"webhook answered HTTP {code}", status=code)
    if code >= 400:
        raise ClientError(f"webhook answered HTTP {code}", status=code)
    return {"sink": "webhook", "status": code}


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
