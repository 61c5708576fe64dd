"""Bounded HTTP: a response byte cap and one overall deadline on every call fsm_engine makes.

:func:`bound` fits both into an ``httpx`` or ``httpx2`` client (the openai SDK's is
``httpx2``; the webhook's is ``httpx``), on every transport it holds, proxies taken from
the environment included:

- **deadline**: a request must be answered in full — connect, TLS handshake, sending,
  head and body — within ``min(its timeout, FSM_HTTP_DEADLINE)`` seconds of being sent
  (its timeout: the largest of its connect/read/write/pool timeouts, e.g. the openai
  SDK's per-call ``timeout=``).  Every socket wait is given at most what is left (a
  network backend around each connection pool's), so a peer trickling one byte a second
  is cut at the deadline: :class:`~fsm_engine.errors.DeadlineExceeded` (retryable);
- **byte cap**: a body may hold ``FSM_HTTP_MAX_BYTES`` bytes (default 16 MiB): a
  ``Content-Length`` above it is refused before the body is read, a longer body is cut
  as it streams, so memory stays bounded: :class:`~fsm_engine.errors.ResponseTooLarge`
  (not retryable).  Responses are asked uncompressed (``Accept-Encoding: identity``) and
  a compressed one is refused the same way (its decoded size has no bound);
- **certificates**: a TLS verification failure raises
  :class:`~fsm_engine.errors.CertificateError` (not retryable) instead of a connection
  error.

These errors are raised from the transport, so the openai SDK lets them through as they
are.  Fitting them uses two private attributes both libraries keep: a client's
``_transport``/``_mounts`` and a connection pool's ``_network_backend``; :func:`bound`
raises ``RuntimeError`` when they are missing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fsm_engine.errors import CertificateError, DeadlineExceeded, InvalidInput, ResponseTooLarge
from fsm_engine.policies import certificate_error

__all__ = ["Caps", "bound", "env_number", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_MIN_WAIT = 0.001  # seconds: a socket timeout of 0 would mean non-blocking, not "expired"
#: the monotonic instant the current exchange must end by (read by the wrapped sockets)
_DEADLINE: ContextVar[float | None] = ContextVar("fsm_http_deadline", default=None)


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


def _left(timeout: float | None) -> float | None:
    """``timeout`` cut to what is left of the current exchange's deadline."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = max(_MIN_WAIT, deadline - time.monotonic())
    return left if timeout is None else min(timeout, left)


@dataclass(slots=True)
class _Exchange:
    """One request's bounds while it runs: where, its deadline, the body bytes so far."""

    lib: ModuleType
    caps: Caps
    what: str
    budget: float | None
    deadline: float | None
    received: int = field(default=0)

    @classmethod
    def start(cls, lib: ModuleType, caps: Caps, request: Any) -> _Exchange:
        budget = caps.budget(request)
        url = request.url
        what = f"{request.method} {url.scheme}://{url.host}:{url.port or ''}".rstrip(":")
        request.headers["Accept-Encoding"] = "identity"
        return cls(lib, caps, what, budget,
                   None if budget is None else time.monotonic() + budget)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline - _MIN_WAIT

    def late(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"{self.what} timed out after {self.budget:.3g}s (one deadline "
                                f"for connect + head + body; {self.received} body bytes read)")

    def too_large(self, size: str) -> ResponseTooLarge:
        return ResponseTooLarge(f"{self.what}: response body {size}, over the "
                                f"{self.caps.max_bytes} bytes cap (FSM_HTTP_MAX_BYTES)")

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Run one step of the exchange under its deadline, its errors made precise."""
        token = _DEADLINE.set(self.deadline)
        try:
            yield
        except self.lib.TimeoutException:
            if self.expired():
                raise self.late() from None
            raise
        except (self.lib.TransportError, ssl.SSLError) as exc:
            cert = certificate_error(exc)
            if cert is None:
                raise
            reason = cert.verify_message or cert.reason or "verification failed"
            raise CertificateError(f"{self.what}: TLS certificate verification failed "
                                   f"({reason})") from None
        finally:
            _DEADLINE.reset(token)

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
        if self.expired():
            raise self.late()


class _SyncBody:
    """A response body read under its exchange's deadline and byte cap."""

    def __init__(self, inner: Any, exchange: _Exchange) -> None:
        self._inner, self._x = inner, exchange

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        while True:
            with self._x.guard():
                chunk = next(chunks, None)
            if chunk is None:
                return
            self._x.count(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _AsyncBody:
    """The async twin of :class:`_SyncBody`."""

    def __init__(self, inner: Any, exchange: _Exchange) -> None:
        self._inner, self._x = inner, exchange

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        while True:
            with self._x.guard():
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            self._x.count(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def _body_class(lib: ModuleType, is_async: bool) -> type:
    """The body wrapper as a subclass of ``lib``'s byte stream (httpx checks the type)."""
    mixin, base = (_AsyncBody, lib.AsyncByteStream) if is_async else (_SyncBody, lib.SyncByteStream)
    return type(f"Bounded{base.__name__}", (mixin, base), {})


class _SyncTransport:
    """A transport sending through ``inner`` with :class:`Caps` enforced."""

    def __init__(self, inner: Any, caps: Caps, lib: ModuleType) -> None:
        self._inner, self._caps, self._lib = inner, caps, lib

    def handle_request(self, request: Any) -> Any:
        exchange = _Exchange.start(self._lib, self._caps, request)
        with exchange.guard():
            response = self._inner.handle_request(request)
        try:
            exchange.head(response)
        except ResponseTooLarge:
            response.close()
            raise
        response.stream = _body_class(self._lib, False)(response.stream, exchange)
        return response

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> _SyncTransport:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._inner.__exit__(*exc_info)


class _AsyncTransport:
    """The async twin of :class:`_SyncTransport`."""

    def __init__(self, inner: Any, caps: Caps, lib: ModuleType) -> None:
        self._inner, self._caps, self._lib = inner, caps, lib

    async def handle_async_request(self, request: Any) -> Any:
        exchange = _Exchange.start(self._lib, self._caps, request)
        with exchange.guard():
            response = await self._inner.handle_async_request(request)
        try:
            exchange.head(response)
        except ResponseTooLarge:
            await response.aclose()
            raise
        response.stream = _body_class(self._lib, True)(response.stream, exchange)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _AsyncTransport:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._inner.__aexit__(*exc_info)


class _SyncStream:
    """A connection whose every wait is cut to the current exchange's deadline."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return bytes(self._inner.read(max_bytes, _left(timeout)))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> _SyncStream:
        return _SyncStream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def __getattr__(self, name: str) -> Any:  # close, get_extra_info
        return getattr(self._inner, name)


class _AsyncStream:
    """The async twin of :class:`_SyncStream`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return bytes(await self._inner.read(max_bytes, _left(timeout)))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, _left(timeout))

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> _AsyncStream:
        return _AsyncStream(await self._inner.start_tls(ssl_context, server_hostname,
                                                        _left(timeout)))

    def __getattr__(self, name: str) -> Any:  # aclose, get_extra_info
        return getattr(self._inner, name)


class _SyncBackend:
    """A network backend whose connections cut their waits to the deadline."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    **options: Any) -> _SyncStream:
        return _SyncStream(self._inner.connect_tcp(host, port, _left(timeout), **options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            **options: Any) -> _SyncStream:
        return _SyncStream(self._inner.connect_unix_socket(path, _left(timeout), **options))

    def __getattr__(self, name: str) -> Any:  # sleep
        return getattr(self._inner, name)


class _AsyncBackend:
    """The async twin of :class:`_SyncBackend`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          **options: Any) -> _AsyncStream:
        return _AsyncStream(await self._inner.connect_tcp(host, port, _left(timeout), **options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  **options: Any) -> _AsyncStream:
        return _AsyncStream(await self._inner.connect_unix_socket(path, _left(timeout),
                                                                  **options))

    def __getattr__(self, name: str) -> Any:  # sleep
        return getattr(self._inner, name)


def _fit(transport: Any, caps: Caps, lib: ModuleType, is_async: bool) -> Any:
    """``transport`` with its pool's sockets under deadlines, wrapped to enforce ``caps``."""
    pool = getattr(transport, "_pool", None)
    if pool is None or not hasattr(pool, "_network_backend"):
        raise RuntimeError(f"cannot bound {type(transport).__name__} of {lib.__name__} "
                           f"{getattr(lib, '__version__', '?')}: its internals changed")
    backend = _AsyncBackend if is_async else _SyncBackend
    pool._network_backend = backend(pool._network_backend)
    return (_AsyncTransport if is_async else _SyncTransport)(transport, caps, lib)


def bound(client: Any, lib: ModuleType, caps: Caps | None = None) -> Any:
    """Fit ``caps`` (default :meth:`Caps.from_env`) into ``client``, a ``lib.Client`` or
    ``lib.AsyncClient`` (``lib``: the ``httpx`` or ``httpx2`` module), and return it.

    Raises InvalidInput for a malformed ``FSM_HTTP_*`` variable, RuntimeError when the
    library's internals are not the expected ones.
    """
    caps = caps or Caps.from_env()
    is_async = isinstance(client, lib.AsyncClient)
    client._transport = _fit(client._transport, caps, lib, is_async)
    client._mounts = {pattern: None if transport is None else
                      _fit(transport, caps, lib, is_async)
                      for pattern, transport in client._mounts.items()}
    return client
