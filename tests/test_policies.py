"""Tests for fsm_engine.policies: retry maths, jitter, Retry-After, classify, breaker — no I/O."""

from __future__ import annotations

import dataclasses
import errno
import random

import pytest

from fsm_engine import (
    BreakerPolicy,
    BudgetExhausted,
    CircuitOpen,
    ClientError,
    InvalidInput,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    RetryPolicy,
    ServerError,
    StepTimeout,
    StructuredOutputError,
)
from fsm_engine.policies import NO_RETRY, Disposition, classify

DRAWS = 500


# -- base delay ------------------------------------------------------------------------
def test_defaults_are_documented_values() -> None:
    p = RetryPolicy()
    assert (p.max_attempts, p.initial_interval, p.backoff_rate, p.max_interval, p.jitter,
            p.max_retry_after) == (3, 1.0, 2.0, 30.0, 1.0, 60.0)
    assert p.problems() == []


def test_base_delays_double_then_cap_at_max_interval() -> None:
    p = RetryPolicy(max_interval=20.0)
    assert [p.base_delay(a) for a in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 20.0]


def test_base_delay_with_default_cap() -> None:
    assert [RetryPolicy().base_delay(a) for a in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_base_delay_with_other_interval_and_rate() -> None:
    p = RetryPolicy(initial_interval=0.5, backoff_rate=3.0, max_interval=10.0)
    assert [p.base_delay(a) for a in (1, 2, 3, 4)] == [0.5, 1.5, 4.5, 10.0]


def test_huge_attempt_numbers_stay_capped() -> None:
    p = RetryPolicy()
    assert p.base_delay(2000) == p.base_delay(10**6) == 30.0
    assert 0.0 <= p.delay(10**6, rng=random.Random(1)) <= 30.0


def test_backoff_rate_one_is_constant() -> None:
    p = RetryPolicy(initial_interval=2.0, backoff_rate=1.0)
    assert {p.base_delay(a) for a in range(1, 10)} == {2.0}


# -- jitter ------------------------------------------------------------------------------
@pytest.mark.parametrize("attempt", [1, 3, 6])
def test_full_jitter_stays_in_zero_to_base_and_spreads(attempt: int) -> None:
    p = RetryPolicy(jitter=1.0)
    base = p.base_delay(attempt)
    rng = random.Random(7)
    delays = [p.delay(attempt, rng=rng) for _ in range(DRAWS)]
    assert all(0.0 <= d <= base for d in delays)
    assert min(delays) < 0.1 * base and max(delays) > 0.9 * base


@pytest.mark.parametrize("attempt", [1, 4])
def test_half_jitter_stays_in_upper_half(attempt: int) -> None:
    p = RetryPolicy(jitter=0.5)
    base = p.base_delay(attempt)
    rng = random.Random(11)
    delays = [p.delay(attempt, rng=rng) for _ in range(DRAWS)]
    assert all(base / 2 <= d <= base for d in delays)
    assert min(delays) < 0.55 * base and max(delays) > 0.95 * base


def test_zero_jitter_is_exact() -> None:
    p = RetryPolicy(jitter=0.0)
    rng = random.Random(3)
    for attempt in range(1, 7):
        assert {p.delay(attempt, rng=rng) for _ in range(20)} == {p.base_delay(attempt)}


def test_seeded_rng_reproduces_delays() -> None:
    p = RetryPolicy()
    a = [p.delay(n % 5 + 1, rng=random.Random(42)) for n in range(10)]
    b = [p.delay(n % 5 + 1, rng=random.Random(42)) for n in range(10)]
    assert a == b
    r1, r2, r3 = random.Random(42), random.Random(42), random.Random(43)
    seq1 = [p.delay(3, rng=r1) for _ in range(10)]
    assert seq1 == [p.delay(3, rng=r2) for _ in range(10)]
    assert seq1 != [p.delay(3, rng=r3) for _ in range(10)]


# -- Retry-After -------------------------------------------------------------------------
def test_retry_after_wins_when_longer() -> None:
    p = RetryPolicy(jitter=0.0)
    assert p.delay(1, retry_after=5.0) == 5.0
    assert p.delay(3, retry_after=4.5) == 4.5


def test_computed_delay_wins_when_retry_after_is_shorter() -> None:
    p = RetryPolicy(jitter=0.0)
    assert p.delay(4, retry_after=2.0) == 8.0


def test_retry_after_is_capped_at_max_retry_after() -> None:
    assert RetryPolicy(jitter=0.0).delay(1, retry_after=3600.0) == 60.0
    assert RetryPolicy(jitter=0.0, max_retry_after=7.0).delay(1, retry_after=100.0) == 7.0


def test_retry_after_beats_jittered_delay_whatever_the_draw() -> None:
    p = RetryPolicy(jitter=1.0)
    rng = random.Random(5)
    assert {p.delay(2, retry_after=3.0, rng=rng) for _ in range(50)} == {3.0}


@pytest.mark.parametrize("hint", [None, 0.0, -5.0])
def test_missing_or_non_positive_retry_after_is_ignored(hint: float | None) -> None:
    assert RetryPolicy(jitter=0.0).delay(2, retry_after=hint) == 2.0


# -- should_retry and problems -------------------------------------------------------------
@pytest.mark.parametrize("attempt, expected", [(1, True), (2, True), (3, False), (4, False)])
def test_should_retry_boundaries(attempt: int, expected: bool) -> None:
    assert RetryPolicy(max_attempts=3).should_retry(attempt) is expected


def test_single_attempt_never_retries() -> None:
    assert NO_RETRY.max_attempts == 1
    assert not NO_RETRY.should_retry(1)


@pytest.mark.parametrize("kwargs, problem", [
    ({"max_attempts": 0}, "max_attempts must be >= 1"),
    ({"max_attempts": -3}, "max_attempts must be >= 1"),
    ({"initial_interval": -0.1}, "intervals must be >= 0 seconds"),
    ({"max_interval": -1.0}, "intervals must be >= 0 seconds"),
    ({"backoff_rate": 0.99}, "backoff_rate must be >= 1"),
    ({"jitter": 1.01}, "jitter must be within [0, 1]"),
    ({"jitter": -0.01}, "jitter must be within [0, 1]"),
])
def test_problems_name_each_invalid_value(kwargs: dict, problem: str) -> None:
    assert RetryPolicy(**kwargs).problems() == [problem]


def test_problems_lists_every_invalid_value() -> None:
    p = RetryPolicy(max_attempts=0, initial_interval=-1, backoff_rate=0.5, jitter=3.0)
    assert len(p.problems()) == 4


def test_boundary_values_are_valid() -> None:
    assert RetryPolicy(max_attempts=1, initial_interval=0.0, max_interval=0.0, backoff_rate=1.0,
                       jitter=0.0).problems() == []
    assert RetryPolicy(jitter=1.0).problems() == []


def test_policies_are_frozen_values() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RetryPolicy().max_attempts = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BreakerPolicy().min_calls = 1  # type: ignore[misc]
    assert RetryPolicy(max_attempts=2) == RetryPolicy(max_attempts=2)
    assert hash(RetryPolicy()) == hash(RetryPolicy())


# -- classify ----------------------------------------------------------------------------
@pytest.mark.parametrize("exc, expected", [
    (ProviderUnavailable("connection refused"), Disposition.RETRY),
    (ProviderTimeout("read timeout"), Disposition.RETRY),
    (RateLimited("slow down", status=429, retry_after=2.0), Disposition.RETRY),
    (ServerError("bad gateway", status=502), Disposition.RETRY),
    (ClientError("bad request", status=400), Disposition.FAIL),
    (ClientError("unauthorised", status=401), Disposition.FAIL),
    (StructuredOutputError("not JSON", raw="{", errors=["x"]), Disposition.REASK),
    (CircuitOpen("openai:gpt", 3.0), Disposition.FALLBACK),
    (BudgetExhausted(120, 100), Disposition.FALLBACK),
    (TypeError("unsupported operand"), Disposition.FAIL),
    (KeyError("missing"), Disposition.FAIL),
    (ValueError("bad"), Disposition.FAIL),
    (InvalidInput("bad update"), Disposition.FAIL),
    (StepTimeout(2.0), Disposition.RETRY),
    (TimeoutError(), Disposition.RETRY),
    (ConnectionResetError(errno.ECONNRESET, "reset"), Disposition.RETRY),
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), Disposition.RETRY),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_classify(exc: BaseException, expected: Disposition) -> None:
    assert classify(exc) is expected


def test_classify_other_oserrors_fail_as_documented() -> None:
    """Only connection errors and timeouts are transient; a missing file is not."""
    assert classify(OSError(errno.EIO, "Input/output error")) is Disposition.FAIL
    assert classify(FileNotFoundError(errno.ENOENT, "gone")) is Disposition.FAIL


# -- breaker -----------------------------------------------------------------------------
@pytest.mark.parametrize("successes, failures, opens", [
    (0, 0, False),
    (0, 4, False),   # below min_calls
    (2, 2, False),   # below min_calls
    (3, 2, False),   # 40 % < 50 %
    (2, 3, True),    # 60 %
    (5, 5, True),    # exactly the rate: at or above opens
    (0, 5, True),
    (10, 0, False),
    (51, 49, False),
])
def test_breaker_should_open_with_defaults(successes: int, failures: int, opens: bool) -> None:
    assert BreakerPolicy().should_open(successes, failures) is opens


def test_breaker_custom_thresholds() -> None:
    p = BreakerPolicy(failure_rate=1.0, min_calls=1)
    assert p.should_open(0, 1)
    assert not p.should_open(1, 1)
    strict = BreakerPolicy(failure_rate=0.1, min_calls=10)
    assert strict.should_open(9, 1)
    assert not strict.should_open(8, 1)
