"""Rate limits per provider + model, shared by every worker through the store.

``Models`` keeps one ``RateLimiter`` per limited model; the model-call layer
(``runtime.calls.rate.RateLimitLayer``) asks it for room before each call, with the call's
estimated tokens (counted prompt + ``max_tokens``), and settles the real usage
after.  No room: ``RateLimitWait``, and the step ends with the instance waiting
durably (status ``waiting``, reason ``rate_limited``, ``next_attempt_at`` when the
window has room), holding no worker slot and spending no retry attempt.

Store faults fail open, like the breaker: a limiter whose store cannot be reached
lets the call through (logged) rather than stopping every model call while the
database restarts; a settlement it cannot write is dropped (the call's admission
then counts its estimate until it expires).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping

from ...errors import FsmError, InvalidInput, RateLimitWait, StoreError
from ...policies import RateLimit
from ...store.base import Store
from ...store.rates import RateRequest

log = logging.getLogger("fsm_engine")

#: Environment variables ``FSM_RATE_LIMIT_<NAME>=rpm:…,tpm:…`` add limits (``NAME``: a
#: model name, ``DEFAULT`` for the default provider).
ENV_PREFIX = "FSM_RATE_LIMIT_"


class RateLimiter:
    """One shared limit (``name``: ``"provider:model"``)."""

    def __init__(self, store: Store, name: str, policy: RateLimit,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.name, self.policy, self.clock = store, name, policy, clock

    def acquire(self, tokens: int) -> str | None:
        """Admit a call of up to ``tokens`` tokens; its key (``None``: admitted without a
        record, the store being unreachable).  Raises ``RateLimitWait`` when the window
        has no room, ``FsmError`` when the call alone exceeds the token limit."""
        p = self.policy
        if p.tpm is not None and tokens > p.tpm:
            raise FsmError(f"a call of ~{tokens} tokens (prompt + max_tokens) can never fit "
                           f"the rate limit of {self.name!r} ({p.tpm} tokens per "
                           f"{p.window_s:g}s)")
        key = uuid.uuid4().hex
        req = RateRequest(self.name, key, self.clock(), tokens, p.rpm, p.tpm, p.window_s,
                          p.hold_s)
        try:
            wait, what = self.store.rate_acquire(req)
        except StoreError as exc:
            log.warning("rate limit %s unreadable, letting the call through: %s", self.name, exc)
            return None
        if wait > 0:
            raise RateLimitWait(self.name, wait, what)
        return key

    def settle(self, key: str | None, tokens: int) -> None:
        """The call ``key`` ended having taken ``tokens``: it counts them for a window
        from now.  A store fault drops the settlement (the estimate keeps counting)."""
        if key is None:
            return
        try:
            self.store.rate_settle(self.name, key, tokens, self.clock() + self.policy.window_s)
        except StoreError as exc:
            log.warning("rate limit %s: usage not recorded: %s", self.name, exc)


def limits_from_specs(specs: list[str] | None,
                      environ: Mapping[str, str] | None = None) -> dict[str, RateLimit]:
    """Limits by model name from ``--rate-limit NAME=rpm:…,tpm:…[,window:S]`` values and
    ``FSM_RATE_LIMIT_<NAME>`` variables (a value given beats the variable); ``NAME`` is a
    model name of ``--llm`` (``*`` or ``default``: the default provider) or a
    ``provider:model`` key.  Raises ``InvalidInput`` for a malformed value."""
    env = os.environ if environ is None else environ
    out: dict[str, RateLimit] = {}
    for value in specs or []:
        name, limit = parse_named(value)
        out[name] = limit  # type: ignore[assignment]  # never None: not removable
    for key, spec in env.items():
        if key.startswith(ENV_PREFIX) and len(key) > len(ENV_PREFIX):
            out.setdefault(_name(key[len(ENV_PREFIX):].lower()), RateLimit.parse(spec))
    return out


def parse_named(value: str, *, removable: bool = False) -> tuple[str, RateLimit | None]:
    """``NAME=rpm:…,tpm:…[,window:S]`` as (the model name, ``*`` for ``default``; its
    limit); with ``removable``, ``NAME=none`` gives ``None`` (``fsm limits``: remove it).
    Raises ``InvalidInput`` for a malformed value."""
    name, sep, spec = value.partition("=")
    if not sep or not name:
        raise InvalidInput(f"--rate-limit {value!r}: expected NAME=rpm:N,tpm:N"
                           + (" or NAME=none" if removable else ""))
    if removable and spec.strip() == "none":
        return _name(name), None
    return _name(name), RateLimit.parse(spec)


def _name(name: str) -> str:
    return "*" if name in ("*", "default") else name
