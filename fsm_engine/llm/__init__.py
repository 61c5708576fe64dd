"""LLM providers: one async ``complete()`` protocol and its implementations.

* :class:`OpenAICompatible` any OpenAI-compatible HTTP endpoint (``openai`` SDK)
* :class:`LocalLlama`       embedded Gemma 3 270M via llama.cpp (the ``[local]`` extra)
* :class:`Scripted`         canned replies from JSONL, for tests and demos
* :class:`FaultInjector`    wraps any provider and injects timeouts, 429s, bad JSON...

Importing this package needs neither llama_cpp nor a network.
"""

from fsm_engine.llm.base import Completion, Provider
from fsm_engine.llm.faults import FaultInjector, parse_fault_spec
from fsm_engine.llm.local import LocalLlama
from fsm_engine.llm.openai_compat import OpenAICompatible
from fsm_engine.llm.scripted import Scripted
from fsm_engine.llm.select import provider_from_spec

__all__ = [
    "Completion", "Provider", "OpenAICompatible", "LocalLlama", "Scripted",
    "FaultInjector", "parse_fault_spec", "provider_from_spec",
]
