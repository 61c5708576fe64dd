"""Choose a provider from a short spec string (CLI flags, environment).

Specs: ``"local"`` (embedded Gemma), ``"local:NAME"`` (a packaged model, e.g.
``qwen2.5-0.5b``), ``"local:PATH.gguf"``, ``"openai"``
(OpenAI-compatible HTTP, configured from the environment) and
``"scripted:FILE.jsonl"`` (canned replies).
"""

from __future__ import annotations

import os

from fsm_engine.errors import InvalidInput
from fsm_engine.llm.base import Provider
from fsm_engine.llm.faults import FaultInjector, parse_fault_spec

__all__ = ["provider_from_spec", "default_spec"]

SPECS = "local, local:NAME (qwen2.5-0.5b), local:PATH.gguf, openai, scripted:FILE.jsonl"


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
    if kind == "openai" and not arg:
        from fsm_engine.llm.openai_compat import OpenAICompatible
        provider = OpenAICompatible()
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
