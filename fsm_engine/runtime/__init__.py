"""The runtime: compiled machines, the engine, and what actions see.

The names below are imported on first use (PEP 562), so that a light module of the
runtime (``runtime.fleet.liveness``, ``runtime.values``) comes without the engine: ``fsm list``
imports no engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compiled import CompiledMachine, compile_machine
    from .engine import Engine
    from .loader import load_machine
    from .step import MeteredLLM, Step

_LAZY = {"Engine": ".engine", "CompiledMachine": ".compiled", "compile_machine": ".compiled",
         "load_machine": ".loader", "Step": ".step", "MeteredLLM": ".step"}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


__all__ = ["Engine", "CompiledMachine", "compile_machine", "load_machine", "Step", "MeteredLLM"]
