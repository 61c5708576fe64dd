"""Which model each state calls: names in the machine, providers at run time.

A state names the model it calls (``State("infer", ..., llm="primary")``); the
names map to providers when an engine is built, never in the machine module:
``Engine(db, llm={"primary": openai, "fallback": local})``, or one provider for
every state (``Engine(db, llm=local)``).  A name with no provider of its own
uses the default provider (the mapping's ``"*"`` entry, or the single
provider), so a machine that names two models runs unchanged on one.

Circuit breakers are per provider + model (``"{provider.name}:{provider.model}"``),
shared through the store by every process: a breaker opened by ``primary``'s
failures never blocks calls to ``fallback``'s model.  So are rate limits
(``rate_limits={"primary": RateLimit(tpm=40_000)}``, see ``runtime.fleet.rates``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..definition.spec import State
from ..errors import FsmError
from ..policies import BreakerPolicy, RateLimit
from ..store.base import Store
from .fleet.breaker import Breaker
from .fleet.rates import RateLimiter

__all__ = ["Models", "DEFAULT", "model_key"]

#: The mapping key of the provider used by states that name no model (or an unmapped one).
DEFAULT = "*"


def model_key(provider: Any) -> str:
    """``"{name}:{model}"``: what breakers, rate limits and token counts are kept per."""
    return f"{getattr(provider, 'name', 'llm')}:{getattr(provider, 'model', '?')}"


class Models:
    """The providers of one engine by model name, and one breaker per provider + model.

    ``llm`` is a provider, a mapping of names to providers (``"*"`` = the
    default), or None (states that call a model then fail with a clear error).
    """

    def __init__(self, llm: Any, store: Store, policy: BreakerPolicy | None,
                 clock: Callable[[], float] = time.time,
                 rate_limits: Mapping[str, RateLimit] | None = None) -> None:
        named = dict(llm) if isinstance(llm, Mapping) else ({} if llm is None else {DEFAULT: llm})
        self.by_name: dict[str, Any] = named
        self.default: Any = named.get(DEFAULT)
        self.store, self.policy, self.clock = store, policy, clock
        self._breakers: dict[str, Breaker] = {}
        #: Rate limits as given: by model name (``"*"``: the default) or ``provider:model``.
        self.rate_limits: dict[str, RateLimit] = dict(rate_limits or {})
        self._own_rates = dict(self.rate_limits)
        self._limiters: dict[tuple[str, str | None], RateLimiter | None] = {}
        self._build: Callable[[str], Any] | None = None

    def defer(self, build: Callable[[str], Any]) -> None:
        """Build the providers only when the first machine that may call a model is
        registered (``need``): ``build(use)`` (``use``: that machine's
        ``CompiledMachine.model_use``, ``"maybe"`` or ``"declared"``) returns what ``llm``
        takes; its errors (``ClientError``: a model that cannot be set up) propagate to
        the registration, and the next one builds again."""
        self._build = build

    def need(self, use: str) -> None:
        """A machine whose states ``use`` a model (``CompiledMachine.model_use``) is about
        to run here: the deferred providers are built now (once), unless ``use`` is
        ``"none"``."""
        if self._build is None or use == "none":
            return
        llm = self._build(use)
        self._build = None
        named = dict(llm) if isinstance(llm, Mapping) else ({} if llm is None else {DEFAULT: llm})
        self.by_name.update(named)
        self.default = self.by_name.get(DEFAULT)

    def use_stored_rates(self, stored: Mapping[str, RateLimit]) -> None:
        """Obey the fleet's stored rate limits (``runtime.fleet.limits``), tightened by the ones
        this engine was given; the limiters are rebuilt when the result changed."""
        from .fleet.limits import merge_rates
        rates = merge_rates(self._own_rates, stored)
        if rates != self.rate_limits:
            self.rate_limits, self._limiters = rates, {}

    def replace(self, old: Any, new: Any) -> None:
        """Serve every name that ``old`` served with ``new`` (the default too)."""
        for name, provider in list(self.by_name.items()):
            if provider is old:
                self.by_name[name] = new
        if self.default is old:
            self.default = new

    def set_default(self, provider: Any) -> None:
        """Make ``provider`` the default (key ``"*"``)."""
        self.by_name[DEFAULT] = self.default = provider

    def for_state(self, state: State) -> Any:
        """The provider ``state`` calls (its named one, else the default; None: none)."""
        if state.llm is not None:
            provider = self.by_name.get(state.llm)
            if provider is not None:
                return provider
        return self.default

    def breaker(self, provider: Any) -> Breaker | None:
        """The breaker of ``provider``'s model (None when breakers are off or no provider)."""
        if self.policy is None or provider is None:
            return None
        key = model_key(provider)
        found = self._breakers.get(key)
        if found is None:  # stateless apart from its row in the store: one per model will do
            found = self._breakers[key] = Breaker(self.store, key, self.policy, self.clock)
        return found

    def limiter(self, provider: Any, alias: str | None = None) -> RateLimiter | None:
        """The shared rate limit of ``provider``'s model (None: not limited).  A limit
        given by model name applies to the provider that name maps to, and to the one
        serving a state that names it (``alias``: the state's ``llm``; a state's
        ``llm="primary"`` served by the default provider when no ``--llm primary=…`` is
        given).  The window is kept per ``provider:model`` whichever name chose it."""
        if provider is None or not self.rate_limits:
            return None
        key = model_key(provider)
        if (key, alias) not in self._limiters:
            policy = self.rate_limits.get(key)
            if policy is None and alias in self.rate_limits \
                    and (self.by_name.get(alias) or self.default) is provider:
                policy = self.rate_limits[alias]
            for name, limit in self.rate_limits.items():
                if policy is None and self.by_name.get(name) is provider:
                    policy = limit
            self._limiters[(key, alias)] = (None if policy is None
                                            else RateLimiter(self.store, key, policy, self.clock))
        return self._limiters[(key, alias)]

    def describe(self) -> dict[str, str]:
        """Each configured name and the ``provider:model`` it maps to (for headers, history)."""
        return {name: model_key(p) for name, p in self.by_name.items()}

    def unique(self) -> list[Any]:
        """Every distinct provider object (two names may share one)."""
        seen: dict[int, Any] = {}
        for provider in self.by_name.values():
            seen.setdefault(id(provider), provider)
        return list(seen.values())

    def check(self, states: Mapping[str, State]) -> None:
        """Raise ``FsmError`` naming each state whose model has no provider and no default
        (an engine with no provider at all, e.g. one only cancelling, is not checked)."""
        if self.default is not None or not self.by_name:
            return
        missing = sorted({s.llm for s in states.values() if s.llm and s.llm not in self.by_name})
        if missing:
            raise FsmError("no provider for model name(s) " + ", ".join(map(repr, missing))
                           + f"; configured: {', '.join(self.by_name) or 'none'}")

    async def aclose(self) -> None:
        """Close every distinct provider (the local model's child process among them)."""
        for provider in self.unique():
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()
