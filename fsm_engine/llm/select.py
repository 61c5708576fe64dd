"""Choose a provider from a short spec string (CLI flags, environment).

Specs: ``"local"`` (the embedded default, Qwen2.5-Coder-0.5B-Instruct), ``"local:NAME"``
(a packaged model, e.g. ``gemma-3-270m``), ``"local:PATH.gguf"``, ``"openai"``
(OpenAI-compatible HTTP, configured from the environment; ``"openai:MODEL"`` names
the model) and
``"scripted:FILE.jsonl"`` (canned replies).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from fsm_engine.errors import ClientError, InvalidInput
from fsm_engine.llm.base import Completion, Message, Provider
from fsm_engine.llm.faults import FaultInjector, parse_fault_spec

__all__ = ["provider_from_spec", "providers_from_specs", "default_spec", "Unavailable"]

SPECS = ("local, local:NAME (gemma-3-270m), local:PATH.gguf, openai, openai:MODEL, "
         "scripted:FILE.jsonl")


def default_spec() -> str:
    """``$FSM_LLM``, else ``"openai"`` when ``$OPENAI_BASE_URL`` is set, else ``"local"``."""
    if os.environ.get("FSM_LLM"):
        return os.environ["FSM_LLM"]
    return "openai" if os.environ.get("OPENAI_BASE_URL") else "local"


def provider_from_spec(spec: str | None, *, faults: str | None = None,
                       seed: int | None = None) -> Provider:
    """Build the provider ``spec`` names (None → :func:`default_spec`).

    ``faults`` (e.g. ``"timeout=0.1,http429=0.05"``) wraps it in a
    :class:`FaultInjector` seeded with ``seed``.  Raises InvalidInput for an
    unknown spec or fault list, ClientError when the local extra is missing.
    """
    spec = (spec or default_spec()).strip()
    kind, _, arg = spec.partition(":")
    provider: Provider
    if kind == "openai":
        from fsm_engine.llm.openai_compat import OpenAICompatible
        provider = OpenAICompatible(model=arg or None)
    elif kind == "local":
        from fsm_engine.llm.local import LocalLlama
        provider = LocalLlama(model_path=arg or None, seed=seed or 0)
    elif kind == "scripted" and arg:
        from fsm_engine.llm.scripted import Scripted
        provider = Scripted(arg)
    else:
        raise InvalidInput(f"unknown LLM provider {spec!r}; expected one of: {SPECS}")
    if faults:
        return FaultInjector(provider, parse_fault_spec(faults), seed=seed)
    return provider


KINDS = ("local", "openai", "scripted")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


class Unavailable(Provider):
    """A model that could not be set up (``providers_from_specs(lazy=True)``): nothing
    fails until a state calls it, and then that call raises ``ClientError`` naming the
    spec and why (not retryable: the state fails, or takes its fallback)."""

    name = "unavailable"

    def __init__(self, spec: str, reason: str) -> None:
        self.model, self.reason = spec, reason

    def describe(self) -> str:
        """One line for a run's header."""
        return f"{self.model} (unavailable: {self.reason})"

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """Raise ``ClientError``: the model named ``self.model`` could not be set up."""
        raise ClientError(f"model {self.model!r} is unavailable: {self.reason}")


def _built(spec: str, faults: str | None, seed: int | None, lazy: bool) -> Provider:
    """``provider_from_spec(spec)``; with ``lazy`` a provider that cannot be set up
    (``ClientError``: an extra not installed, no API key) is ``Unavailable`` instead."""
    try:
        return provider_from_spec(spec, faults=faults, seed=seed)
    except ClientError as exc:
        if not lazy:
            raise
        return Unavailable(spec, str(exc))


def providers_from_specs(specs: list[str] | None, *, faults: str | None = None,
                         seed: int | None = None,
                         environ: Mapping[str, str] | None = None,
                         lazy: bool = False) -> dict[str, Provider]:
    """Providers by model name for ``Engine(llm=...)`` from ``--llm`` values.

    Each value is ``SPEC`` (the default provider, key ``"*"``) or ``NAME=SPEC``
    (the provider for states declaring ``llm="NAME"``); ``FSM_LLM_<NAME>``
    variables add names not given (``FSM_LLM_FALLBACK=local`` → ``fallback``; a variable
    whose value is not a
    provider spec, like ``FSM_LLM_CONCURRENCY``, is a setting, not a name).
    The default is :func:`default_spec` when no value names one.  Equal specs
    share one provider (one local model process for two names).  Raises
    InvalidInput for a malformed value or a name given twice, ``ClientError`` when a
    provider cannot be set up (``lazy``: that name gets an ``Unavailable`` provider, which
    raises it when a state calls it).
    """
    env = os.environ if environ is None else environ
    wanted: dict[str, str] = {}
    for value in specs or []:
        name, sep, spec = value.partition("=")
        if not sep or ":" in name:  # a bare spec (scripted:a=b.jsonl keeps its '=')
            name, spec = "*", value
        elif not _NAME.fullmatch(name):
            raise InvalidInput(f"--llm {value!r}: {name!r} is not a model name")
        if name in wanted:
            raise InvalidInput(f"--llm gives model {name!r} twice")
        wanted[name] = spec
    for key, spec in env.items():  # other FSM_LLM_* settings (CONCURRENCY …) hold no spec
        if key.startswith("FSM_LLM_") and spec.partition(":")[0] in KINDS:
            wanted.setdefault(key[len("FSM_LLM_"):].lower(), spec)
    wanted.setdefault("*", default_spec())
    built: dict[str, Provider] = {}
    out: dict[str, Provider] = {}
    for name, spec in wanted.items():
        key = spec.strip()
        if key not in built:
            built[key] = _built(key, faults, seed, lazy)
        out[name] = built[key]
    return out
