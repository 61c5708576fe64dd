"""Per-state policies: frozen values with documented defaults and pure maths.

Nothing here does I/O; the runtime reads these values and persists what
they decide (attempt numbers, next-attempt times, breaker state).

Sources:
- exponential backoff ``initial_interval * backoff_rate ** (attempt - 1)``
  capped at ``max_interval`` is tenacity's ``wait_exponential`` and AWS Step
  Functions' ``Retry`` (IntervalSeconds, BackoffRate, MaxDelaySeconds);
- jitter follows "Exponential Backoff And Jitter" (Marc Brooker, AWS
  Architecture Blog, 2015): with ``jitter=1.0`` the delay is drawn uniformly
  from ``[0, base]`` ("full jitter"), with ``jitter=j`` from
  ``[base * (1 - j), base]``;
- ``Retry-After`` (RFC 9110 §10.2.3) overrides the computed delay when it is
  longer, and is still capped by ``max_retry_after``.
"""

from __future__ import annotations

import errno
import math
import random
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import Enum
from typing import Any, Literal

import tenacity

from .errors import (
    BudgetExhausted,
    CircuitOpen,
    ClientError,
    InvalidInput,
    ProviderError,
    StepTimeout,
    StructuredOutputError,
)


class Disposition(str, Enum):  # noqa: UP042 - str() of a member stays "Disposition.X"
    """What the runtime does with an exception raised by an action."""

    RETRY = "retry"        # transient: another attempt may succeed
    REASK = "reask"        # output failed parsing/validation: go to the re-ask path
    FALLBACK = "fallback"  # no point retrying here: take the fallback transition now
    FAIL = "fail"          # bad input or programming error: fail at once


RETRY, FAIL = Disposition.RETRY, Disposition.FAIL

#: ``errno`` values of an ``OSError`` that mean the network, not the program, failed.
NETWORK_ERRNOS = frozenset(getattr(errno, name) for name in (
    "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "ETIMEDOUT", "EHOSTUNREACH", "EHOSTDOWN",
    "ENETUNREACH", "ENETDOWN", "ENETRESET", "EPIPE", "EADDRNOTAVAIL", "ESHUTDOWN")
    if hasattr(errno, name))
#: ``socket.gaierror`` codes that are the caller's mistake, not a DNS failure.
_BAD_LOOKUPS = frozenset(getattr(socket, name) for name in (
    "EAI_BADFLAGS", "EAI_FAMILY", "EAI_SOCKTYPE", "EAI_SERVICE") if hasattr(socket, name))


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (``status_code``, ``status``, ``code`` or its
    ``response``'s), or None."""
    for holder in (exc, getattr(exc, "response", None)):
        for attr in ("status_code", "status", "code"):
            value = getattr(holder, attr, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def by_status(status: int | None) -> Disposition:
    """408, 425, 429 and 5xx → ``RETRY``; any other status (other 4xx, 3xx) or none →
    ``FAIL``."""
    if status is None:
        return FAIL
    return RETRY if status in (408, 425, 429) or status >= 500 else FAIL


def _status(exc: BaseException) -> Disposition:
    return by_status(http_status(exc))


def _errno(exc: BaseException) -> Disposition:
    return RETRY if getattr(exc, "errno", None) in NETWORK_ERRNOS else FAIL


def _lookup(exc: BaseException) -> Disposition:
    return FAIL if getattr(exc, "errno", None) in _BAD_LOOKUPS else RETRY


def _reason(exc: BaseException) -> Disposition:
    """An error wrapping its cause in ``reason`` (urllib3's MaxRetryError, urllib's URLError)."""
    reason = getattr(exc, "reason", None)
    return classify(reason) if isinstance(reason, BaseException) else RETRY


def certificate_error(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    """The TLS certificate verification error ``exc`` is or wraps (along ``__cause__`` /
    ``__context__``: httpx raises it as a ``ConnectError``), else None."""
    for _ in range(8):
        if exc is None or isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


_Rule = Callable[[BaseException], Disposition]

#: (top-level package, class name) → disposition or rule, matched along the exception's MRO,
#: most specific class first.  Covers the HTTP clients actions call (requests, httpx,
#: urllib3, aiohttp, the openai SDK, urllib, http.client) and the standard library's socket,
#: SSL and OS errors; none of them is imported.
RULES: dict[tuple[str, str], Disposition | _Rule] = {
    # the standard library
    ("builtins", "TimeoutError"): RETRY,
    ("builtins", "ConnectionError"): RETRY,       # refused, reset, aborted, broken pipe
    ("builtins", "OSError"): _errno,              # only network errnos are transient
    ("socket", "gaierror"): _lookup,              # DNS
    ("socket", "herror"): RETRY,
    ("ssl", "SSLCertVerificationError"): FAIL,
    ("ssl", "SSLEOFError"): RETRY,                # the peer cut the TLS stream
    ("ssl", "SSLZeroReturnError"): RETRY,
    ("ssl", "SSLError"): FAIL,
    ("http", "IncompleteRead"): RETRY,
    ("http", "RemoteDisconnected"): RETRY,
    ("urllib", "HTTPError"): _status,
    ("urllib", "URLError"): _reason,
    # requests (its exceptions are OSErrors without an errno)
    ("requests", "SSLError"): FAIL,
    ("requests", "ConnectionError"): RETRY,       # also ConnectTimeout, ProxyError
    ("requests", "Timeout"): RETRY,               # ReadTimeout
    ("requests", "ChunkedEncodingError"): RETRY,
    ("requests", "RetryError"): RETRY,            # urllib3 gave up on 5xx / 429
    ("requests", "HTTPError"): _status,           # raise_for_status()
    ("requests", "RequestException"): FAIL,       # invalid URL, schema, header, JSON ...
    # httpx
    ("httpx", "TimeoutException"): RETRY,         # connect / read / write / pool
    ("httpx", "NetworkError"): RETRY,             # connect / read / write / close
    ("httpx", "RemoteProtocolError"): RETRY,
    ("httpx", "ProxyError"): RETRY,
    ("httpx", "HTTPStatusError"): _status,        # raise_for_status()
    ("httpx", "HTTPError"): FAIL,                 # unsupported protocol, decoding, redirects
    # urllib3
    ("urllib3", "SSLError"): FAIL,
    ("urllib3", "MaxRetryError"): _reason,
    ("urllib3", "TimeoutError"): RETRY,           # connect / read; NewConnectionError, DNS
    ("urllib3", "ProtocolError"): RETRY,          # connection aborted mid-response
    ("urllib3", "ProxyError"): RETRY,
    ("urllib3", "IncompleteRead"): RETRY,
    ("urllib3", "ResponseError"): RETRY,          # too many error responses
    ("urllib3", "HTTPError"): FAIL,
    # aiohttp
    ("aiohttp", "ServerFingerprintMismatch"): FAIL,
    ("aiohttp", "ClientSSLError"): FAIL,
    ("aiohttp", "ClientConnectionError"): RETRY,  # connector, DNS, disconnects, timeouts
    ("aiohttp", "ClientPayloadError"): RETRY,
    ("aiohttp", "TooManyRedirects"): FAIL,
    ("aiohttp", "ClientResponseError"): _status,  # raise_for_status()
    ("aiohttp", "ClientError"): FAIL,
    # the openai SDK called directly from an action
    ("openai", "APITimeoutError"): RETRY,
    ("openai", "APIConnectionError"): RETRY,
    ("openai", "APIStatusError"): _status,
    ("openai", "OpenAIError"): FAIL,
}


def classify(exc: BaseException) -> Disposition:
    """Decide how an action's exception is handled.

    - fsm_engine's own errors: ``StructuredOutputError`` → ``REASK``;
      ``CircuitOpen``, ``BudgetExhausted`` → ``FALLBACK``; ``InvalidInput`` and
      ``ClientError`` → ``FAIL``; other ``ProviderError``s and ``StepTimeout`` → ``RETRY``;
    - everything else by :data:`RULES` along the exception's class hierarchy:
      network errors of requests / httpx / urllib3 / aiohttp / the openai SDK /
      urllib, ``TimeoutError``, ``ConnectionError`` and any ``OSError`` with a
      network ``errno`` (:data:`NETWORK_ERRNOS`), DNS failures → ``RETRY``; HTTP
      status errors of those libraries by status (:func:`by_status`: 429 —
      honouring ``Retry-After``, see :func:`retry_after` — 408 and 5xx retry,
      other 4xx fail); TLS certificate errors (also wrapped: httpx's ``ConnectError``,
      see :func:`certificate_error`), invalid URLs, other ``OSError``s
      (a missing file) and every other exception (``TypeError``, ``KeyError`` ...
      programming errors) → ``FAIL``.
    """
    if isinstance(exc, StructuredOutputError):
        return Disposition.REASK
    if isinstance(exc, (CircuitOpen, BudgetExhausted)):
        return Disposition.FALLBACK
    if isinstance(exc, ClientError) or isinstance(exc, InvalidInput):
        return FAIL
    if isinstance(exc, ProviderError):
        return RETRY if exc.retryable else FAIL
    if isinstance(exc, StepTimeout):
        return RETRY
    if certificate_error(exc) is not None:  # however a library wraps it
        return FAIL
    for cls in type(exc).__mro__:
        rule = RULES.get((cls.__module__.partition(".")[0], cls.__name__))
        if rule is not None:
            return rule if isinstance(rule, Disposition) else rule(exc)
    return FAIL


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP-date,
    RFC 9110 §10.2.3).  Returns None when neither header is present or parseable; never
    negative."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def retry_after(exc: BaseException) -> float | None:
    """The wait (seconds) an error asks for: its ``retry_after``, else the ``Retry-After``
    header of its HTTP response (requests, httpx, urllib, aiohttp, openai), else None."""
    hint = getattr(exc, "retry_after", None)
    if isinstance(hint, (int, float)) and not isinstance(hint, bool):
        return float(hint)
    for holder in (getattr(exc, "response", None), exc):
        headers = getattr(holder, "headers", None) if holder is not None else None
        if headers is not None and hasattr(headers, "get"):
            try:
                wait = parse_retry_after(headers)
            except Exception:  # noqa: BLE001 - an odd headers object: no hint
                wait = None
            if wait is not None:
                return wait
    return None


class _Attempt:
    """The one attribute of tenacity's ``RetryCallState`` its wait maths reads."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a state's action is retried after a retryable error.

    Attributes (defaults follow AWS Step Functions' ``Retry`` field):
        max_attempts: total attempts including the first (≥ 1). Default 3.
        initial_interval: delay before attempt 2, seconds. Default 1.0.
        backoff_rate: multiplier per further attempt (≥ 1). Default 2.0.
        max_interval: cap on any single delay, seconds. Default 30.0.
        jitter: 0.0 = none, 1.0 = full jitter (uniform in [0, base]). Default 1.0.
        max_retry_after: cap on a provider's ``Retry-After``, seconds. Default 60.0.
    """

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff_rate: float = 2.0
    max_interval: float = 30.0
    jitter: float = 1.0
    max_retry_after: float = 60.0

    def problems(self) -> list[str]:
        """Return the reasons this policy is invalid (empty when valid)."""
        out = []
        if self.max_attempts < 1:
            out.append("max_attempts must be >= 1")
        if self.initial_interval < 0 or self.max_interval < 0:
            out.append("intervals must be >= 0 seconds")
        if self.backoff_rate < 1:
            out.append("backoff_rate must be >= 1")
        if not 0.0 <= self.jitter <= 1.0:
            out.append("jitter must be within [0, 1]")
        return out

    def base_delay(self, attempt: int) -> float:
        """Delay in seconds before attempt ``attempt + 1`` after ``attempt`` failed, no jitter.

        ``attempt`` is 1-based: ``base_delay(1)`` is ``initial_interval``.
        Computed with tenacity's ``wait_exponential``; never above ``max_interval``.
        """
        wait = tenacity.wait_exponential(multiplier=self.initial_interval,
                                         exp_base=self.backoff_rate, max=self.max_interval)
        return float(wait(_Attempt(attempt)))  # type: ignore[arg-type]

    def delay(self, attempt: int, *, retry_after: float | None = None,
              rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based), jitter applied.

        A ``retry_after`` hint (seconds) wins when longer than the computed delay;
        it is capped at ``max_retry_after``.
        """
        base = self.base_delay(attempt)
        r = (rng or random).random()
        delay = base * (1.0 - self.jitter * r)
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(float(retry_after), self.max_retry_after))
        return delay

    def should_retry(self, attempt: int) -> bool:
        """True when another attempt is allowed after failed attempt ``attempt``."""
        return attempt < self.max_attempts


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """Circuit breaker thresholds, per provider + model.

    The breaker opens when, among the calls recorded in the last ``window``
    seconds, there are at least ``min_calls`` and the failure rate is at or
    above ``failure_rate``. After ``cooldown`` seconds one probe call is let
    through (half-open); its success closes the breaker, its failure reopens it.
    Same scheme as resilience4j's count/time-based CircuitBreaker; the window is kept
    as counts per ``window / 60`` seconds (``runtime.fleet.breaker``), so a call counts for up
    to one such bucket longer than ``window``.

    Defaults: failure_rate 0.5, min_calls 5, window 60 s, cooldown 30 s.
    """

    failure_rate: float = 0.5
    min_calls: int = 5
    window: float = 60.0
    cooldown: float = 30.0

    def should_open(self, successes: int, failures: int) -> bool:
        """Pure decision on the counts observed inside the window."""
        total = successes + failures
        return total >= self.min_calls and failures / total >= self.failure_rate


BreakerState = Literal["closed", "open", "half_open"]

#: Completion policy modes (AWS Lambda durable functions' ``CompletionConfig`` names).
COMPLETION_MODES = ("all_successful", "all_completed", "first_successful", "min_successful",
                    "tolerated_failures", "tolerated_failure_ratio")


@dataclass(frozen=True, slots=True)
class Completion:
    """When a fan-out's join is decided, and whether it succeeded.

    ``mode`` (default ``all_successful``) is implied by the number given:
    ``Completion(min_successful=3)``, ``Completion(tolerated_failures=2)``,
    ``Completion(tolerated_failure_ratio=0.2)``.  A skipped branch counts as a
    success.  The modes, with ``n`` branches, ``s`` succeeded, ``f`` failed and
    ``p = n - s - f`` still running:

    - ``all_successful``: fails at the first failure; succeeds when ``s == n`` (also ``n == 0``);
    - ``all_completed``: succeeds once ``p == 0``, whatever failed;
    - ``first_successful``: succeeds at the first success; fails when ``p == 0`` and ``s == 0``;
    - ``min_successful=N``: succeeds once ``s >= N``; fails once ``s + p < N``;
    - ``tolerated_failures=N``: fails once ``f > N``; else succeeds once ``p == 0``;
    - ``tolerated_failure_ratio=r``: fails once ``f > r * n``; else succeeds once ``p == 0``.

    Once decided, branches still running are cancelled.
    """

    mode: str = "all_successful"
    min_successful: int | None = None
    tolerated_failures: int | None = None
    tolerated_failure_ratio: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_successful", "tolerated_failures", "tolerated_failure_ratio"):
            if getattr(self, name) is not None and self.mode == "all_successful":
                object.__setattr__(self, "mode", name)

    def problems(self) -> list[str]:
        """The reasons this policy is invalid (empty when valid)."""
        if self.mode not in COMPLETION_MODES:
            return [f"completion mode {self.mode!r} is not one of {', '.join(COMPLETION_MODES)}"]
        value = getattr(self, self.mode, None) if self.mode in COMPLETION_MODES[3:] else 0
        if value is None:
            return [f"completion {self.mode} needs a value"]
        if self.mode == "tolerated_failure_ratio" and not 0.0 <= float(value) <= 1.0:
            return ["tolerated_failure_ratio must be within [0, 1]"]
        if self.mode in ("min_successful", "tolerated_failures") and int(value) < 0:
            return [f"{self.mode} must be >= 0"]
        return []

    def decide(self, total: int, succeeded: int, failed: int) -> bool | None:
        """True (joined), False (branch failed) or None (not decided yet)."""
        pending = total - succeeded - failed
        mode = self.mode
        if mode == "all_successful":
            return False if failed else (True if pending == 0 else None)
        if mode == "all_completed":
            return True if pending == 0 else None
        if mode == "first_successful":
            return True if succeeded else (False if pending == 0 else None)
        if mode == "min_successful":
            need = int(self.min_successful or 0)
            return True if succeeded >= need else (False if succeeded + pending < need else None)
        limit = (self.tolerated_failures if mode == "tolerated_failures"
                 else float(self.tolerated_failure_ratio or 0.0) * total)
        if failed > (limit or 0):
            return False
        return True if pending == 0 else None


__all__ = ["Disposition", "classify", "RULES", "NETWORK_ERRNOS", "by_status", "http_status",
           "retry_after", "parse_retry_after", "RetryPolicy", "NO_RETRY", "BreakerPolicy",
           "BreakerState", "Completion", "COMPLETION_MODES"]


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """Answer a state's model calls from stored replies (``State(cache=CachePolicy(...))``).

    A successful reply is stored keyed by SHA-256 of (provider, model, messages and call
    parameters); a later call with the same key within ``ttl_s`` seconds is answered from
    it with 0 tokens (``llm_calls`` entry ``cached: true``).  Keys hold no secrets (no
    API key, URL or header goes into them).  Not allowed on side-effect states.
    """

    ttl_s: float = 3600.0

    def problems(self) -> list[str]:
        """What is wrong with the policy (empty when nothing is)."""
        return [] if self.ttl_s > 0 else ["ttl_s must be > 0 seconds"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A provider + model's rate limit, shared by every worker through the store.

    Args:
        rpm: most calls started per window (``None``: no limit on calls).
        tpm: most tokens per window (``None``: no limit on tokens); a call counts
            ``prompt + max_tokens`` tokens (the prompt counted by the provider's
            tokenizer, else the conservative estimate) from when it is admitted until
            it ends, then what the provider billed.
        window_s: the window, in seconds (default 60: the limits are per minute).  A
            sliding window: no span of ``window_s`` seconds holds more than the limits,
            counting each call from its admission to ``window_s`` after it ended.
        hold_s: seconds after which a call admitted and never ended (its worker died)
            stops counting, on top of ``window_s``.
    """

    rpm: int | None = None
    tpm: int | None = None
    window_s: float = 60.0
    hold_s: float = 300.0

    def problems(self) -> list[str]:
        """What is wrong with the values (``[]``: nothing)."""
        out = [f"{name} must be an int >= 1, not {value!r}"
               for name, value in (("rpm", self.rpm), ("tpm", self.tpm))
               if value is not None and (not isinstance(value, int) or value < 1)]
        if self.rpm is None and self.tpm is None:
            out.append("give rpm, tpm or both")
        if not 0 < self.window_s < math.inf or not 0 < self.hold_s < math.inf:
            out.append("window_s and hold_s must be finite numbers of seconds > 0")
        return out

    @classmethod
    def parse(cls, spec: str) -> RateLimit:
        """``"rpm:500,tpm:40000[,window:60]"`` as a ``RateLimit``; ``InvalidInput``."""
        from .errors import InvalidInput
        fields = {"rpm": "rpm", "tpm": "tpm", "window": "window_s", "hold": "hold_s"}
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, value = part.partition(":")
            if key not in fields or not value:
                raise InvalidInput(f"rate limit {spec!r}: expected rpm:N, tpm:N, window:S")
            try:
                values[fields[key]] = float(value) if key in ("window", "hold") else int(value)
            except ValueError:
                raise InvalidInput(f"rate limit {spec!r}: {value!r} is not a number") from None
        limit = cls(**values)
        if limit.problems():
            raise InvalidInput(f"rate limit {spec!r}: {'; '.join(limit.problems())}")
        return limit
