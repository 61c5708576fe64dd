"""The runtime: compiled machines, the engine, and what actions see."""

from .compiled import CompiledMachine, compile_machine
from .engine import Engine
from .loader import load_machine
from .step import MeteredLLM, Step

__all__ = ["Engine", "CompiledMachine", "compile_machine", "load_machine", "Step", "MeteredLLM"]
