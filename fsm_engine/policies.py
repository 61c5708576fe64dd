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

import random
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import tenacity

from .errors import (
    BudgetExhausted, CircuitOpen, ClientError, InvalidInput, ProviderError, StepTimeout,
    StructuredOutputError,
)


class Disposition(str, Enum):
    """What the runtime does with an exception raised by an action."""

    RETRY = "retry"        # transient: another attempt may succeed
    REASK = "reask"        # output failed parsing/validation: go to the re-ask path
    FALLBACK = "fallback"  # no point retrying here: take the fallback transition now
    FAIL = "fail"          # bad input or programming error: fail at once


def classify(exc: BaseException) -> Disposition:
    """Decide how an action's exception is handled.

    - network errors, provider timeouts, HTTP 429 and 5xx, step timeouts,
      ``TimeoutError`` and ``ConnectionError`` → ``RETRY`` (other ``OSError``s,
      e.g. a missing file, are not transient → ``FAIL``);
    - ``StructuredOutputError`` (unparseable or invalid model output) → ``REASK``;
    - ``CircuitOpen`` and ``BudgetExhausted`` → ``FALLBACK`` (retrying cannot help);
    - HTTP 4xx other than 429, ``InvalidInput`` and everything else
      (``TypeError``, ``KeyError`` ... programming errors) → ``FAIL``.
    """
    if isinstance(exc, StructuredOutputError):
        return Disposition.REASK
    if isinstance(exc, (CircuitOpen, BudgetExhausted)):
        return Disposition.FALLBACK
    if isinstance(exc, ClientError) or isinstance(exc, InvalidInput):
        return Disposition.FAIL
    if isinstance(exc, ProviderError):
        return Disposition.RETRY if exc.retryable else Disposition.FAIL
    if isinstance(exc, (StepTimeout, TimeoutError, ConnectionError)):
        return Disposition.RETRY
    return Disposition.FAIL


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
    Same scheme as resilience4j's count/time-based CircuitBreaker.

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


__all__ = ["Disposition", "classify", "RetryPolicy", "NO_RETRY", "BreakerPolicy", "BreakerState"]
