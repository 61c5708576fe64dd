"""Bounded HTTP: a response byte cap and one overall deadline on every call fsm_engine makes.

:func:`client_options` gives the ``transport=`` and ``mounts=`` of an ``httpx`` or ``httpx2``
``AsyncClient`` (the openai SDK's is ``httpx2``; the webhook's is ``httpx``) through the
libraries' public API alone — a transport wrapping ``AsyncHTTPTransport``, one per
proxy the environment names:

- **deadline**: a request must be answered in full — connect, TLS handshake, sending,
  head and body — within ``min(its timeout, FSM_HTTP_DEADLINE)`` seconds of being sent
  (its timeout: the largest of its connect/read/write/pool timeouts, e.g. the openai
  SDK's per-call ``timeout=``).  Each step of the exchange runs under
  ``asyncio.timeout_at`` of that one instant, so a peer trickling one byte a second is
  cut at the deadline: :class:`~fsm_engine.errors.DeadlineExceeded` (retryable);
- **byte cap**: a body may hold ``FSM_HTTP_MAX_BYTES`` bytes (default 16 MiB): a
  ``Content-Length`` above it is refused before the body is read, a longer body is cut
  as it streams, so memory stays bounded: :class:`~fsm_engine.errors.ResponseTooLarge`
  (not retryable).  Responses are asked uncompressed (``Accept-Encoding: identity``) and
  a compressed one is refused the same way (its decoded size has no bound);
- **certificates**: a TLS verification failure raises
  :class:`~fsm_engine.errors.CertificateError` (not retryable) instead of a connection
  error.

These errors are raised from the transport, so the openai SDK lets them through as they
are.  Only asynchronous clients are bounded: a deadline on a blocking socket cannot be
kept without reaching into the library (a synchronous caller runs its exchange on an
event loop: ``sinks``, :meth:`OpenAICompatible.resolve_model_sync`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from ipaddress import ip_address
from types import ModuleType
from typing import Any

from fsm_engine.errors import CertificateError, DeadlineExceeded, InvalidInput, ResponseTooLarge
from fsm_engine.policies import certificate_error

__all__ = ["Caps", "client_options", "env_proxies", "env_number", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_BYTES = 16 * 1024 * 1024


def env_number(name: str, kind: type, minimum: float) -> Any:
    """``$name`` as a ``kind`` >= ``minimum``, None when unset; InvalidInput when malformed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InvalidInput(f"{name}={raw!r}: expected a number >= {minimum:g}")
    return value


@dataclass(frozen=True, slots=True)
class Caps:
    """The bounds of each exchange: ``max_bytes`` of body, ``deadline`` seconds in all
    (None: the request's own timeout alone)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    deadline: float | None = None

    @classmethod
    def from_env(cls) -> Caps:
        """``FSM_HTTP_MAX_BYTES`` (int >= 1) and ``FSM_HTTP_DEADLINE`` (seconds); InvalidInput."""
        return cls(max_bytes=env_number("FSM_HTTP_MAX_BYTES", int, 1) or DEFAULT_MAX_BYTES,
                   deadline=env_number("FSM_HTTP_DEADLINE", float, 0.001))

    def budget(self, request: Any) -> float | None:
        """Seconds the exchange of ``request`` may take (None: unbounded)."""
        timeouts = (request.extensions.get("timeout") or {}).values()
        given = [float(t) for t in timeouts if t is not None]
        limits = [t for t in (max(given, default=None), self.deadline) if t is not None]
        return min(limits, default=None)


@dataclass(slots=True)
class _Exchange:
    """One request's bounds while it runs: where, its deadline, the body bytes so far."""

    lib: ModuleType
    caps: Caps
    what: str
    budget: float | None
    deadline: float | None  # on the running loop's clock (``loop.time()``), None: unbounded
    received: int = field(default=0)

    @classmethod
    def start(cls, lib: ModuleType, caps: Caps, request: Any) -> _Exchange:
        budget = caps.budget(request)
        url = request.url
        what = f"{request.method} {url.scheme}://{url.host}:{url.port or ''}".rstrip(":")
        request.headers["Accept-Encoding"] = "identity"
        now = asyncio.get_running_loop().time()
        return cls(lib, caps, what, budget, None if budget is None else now + budget)

    def late(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"{self.what} timed out after {self.budget:.3g}s (one deadline "
                                f"for connect + head + body; {self.received} body bytes read)")

    def too_large(self, size: str) -> ResponseTooLarge:
        return ResponseTooLarge(f"{self.what}: response body {size}, over the "
                                f"{self.caps.max_bytes} bytes cap (FSM_HTTP_MAX_BYTES)")

    @asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """Run one step of the exchange under its deadline, its errors made precise."""
        try:
            async with asyncio.timeout_at(self.deadline):
                yield
        except TimeoutError:
            raise self.late() from None
        except self.lib.TimeoutException:
            if self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline:
                raise self.late() from None
            raise
        except (self.lib.TransportError, ssl.SSLError) as exc:
            cert = certificate_error(exc)
            if cert is None:
                raise
            reason = cert.verify_message or cert.reason or "verification failed"
            raise CertificateError(f"{self.what}: TLS certificate verification failed "
                                   f"({reason})") from None

    def head(self, response: Any) -> None:
        """Refuse a response whose declared length or encoding breaks the cap."""
        length = response.headers.get("content-length", "")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if length.strip().isdigit() and int(length) > self.caps.max_bytes:
            raise self.too_large(f"of {int(length)} bytes (Content-Length)")
        if encoding not in ("", "identity"):
            raise self.too_large(f"compressed ({encoding}) though identity was asked, so "
                                 "its decoded size is unbounded")

    def count(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.caps.max_bytes:
            raise self.too_large(f"passed {self.received} bytes")


class _Body:
    """A response body read under its exchange's deadline and byte cap (the mixin of a
    ``lib.AsyncByteStream``: :func:`_classes`)."""

    def __init__(self, inner: Any, exchange: _Exchange) -> None:
        self._inner, self._x = inner, exchange

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        while True:
            async with self._x.guard():
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            self._x.count(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Transport:
    """A transport sending through ``inner`` (a ``lib.AsyncHTTPTransport``) with
    :class:`Caps` enforced (the mixin of a ``lib.AsyncBaseTransport``: :func:`_classes`)."""

    def __init__(self, inner: Any, caps: Caps, lib: ModuleType) -> None:
        self._inner, self._caps, self._lib = inner, caps, lib

    async def handle_async_request(self, request: Any) -> Any:
        exchange = _Exchange.start(self._lib, self._caps, request)
        async with exchange.guard():
            response = await self._inner.handle_async_request(request)
        try:
            exchange.head(response)
        except ResponseTooLarge:
            await response.aclose()
            raise
        body = _classes(self._lib)[0](response.stream, exchange)
        return self._lib.Response(response.status_code, headers=response.headers, stream=body,
                                  extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def _classes(lib: ModuleType) -> tuple[type, type]:
    """The body and transport wrappers as subclasses of ``lib``'s public base classes
    (httpx checks a stream's type)."""
    return (type("BoundedByteStream", (_Body, lib.AsyncByteStream), {}),
            type("BoundedTransport", (_Transport, lib.AsyncBaseTransport), {}))


def env_proxies(env: dict[str, str] | None = None) -> dict[str, str | None]:
    """The proxies the environment names (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``,
    ``NO_PROXY``, either case) as httpx mount patterns: ``{"http://": URL, "all://*.corp":
    None, ...}`` (None: reached directly).

    httpx applies these variables only to the transports it builds itself, so a client
    given its own transport reads them here, by httpx's rules (``httpx`` 0.28
    ``_utils.get_environment_proxies``).
    """
    found = urllib.request.getproxies_environment() if env is None else {
        k.lower()[:-6]: v for k, v in env.items() if k.lower().endswith("_proxy") and v}
    mounts: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        if found.get(scheme):
            url = found[scheme]
            mounts[f"{scheme}://"] = url if "://" in url else f"http://{url}"
    for host in (h.strip() for h in found.get("no", "").split(",")):
        if host == "*":
            return {}
        if host:
            mounts[_direct_pattern(host)] = None
    return mounts


def _direct_pattern(host: str) -> str:
    """The mount pattern of one ``NO_PROXY`` entry."""
    if "://" in host:
        return host
    try:
        address = ip_address(host.strip("[]"))
    except ValueError:
        return f"all://{host}" if host.lower() == "localhost" else f"all://*{host}"
    return f"all://[{address}]" if address.version == 6 else f"all://{address}"


def client_options(lib: ModuleType, caps: Caps | None = None, *, trust_env: bool = True,
                   **transport: Any) -> dict[str, Any]:
    """``{"transport": ..., "mounts": ...}`` for a ``lib.AsyncClient`` (``lib``: the
    ``httpx`` or ``httpx2`` module) bounded by ``caps`` (default :meth:`Caps.from_env`):
    one ``lib.AsyncHTTPTransport(**transport)`` wrapped, and one per proxy of the
    environment when ``trust_env`` (:func:`env_proxies`).

    Raises InvalidInput for a malformed ``FSM_HTTP_*`` variable.
    """
    caps = caps or Caps.from_env()
    bounded = _classes(lib)[1]

    def made(proxy: str | None = None) -> Any:
        return bounded(lib.AsyncHTTPTransport(trust_env=trust_env, proxy=proxy, **transport),
                       caps, lib)
    mounts = {pattern: None if url is None else made(url)
              for pattern, url in (env_proxies() if trust_env else {}).items()}
    return {"transport": made(), "mounts": mounts}
