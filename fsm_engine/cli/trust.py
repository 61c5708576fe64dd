"""``--machines`` for the commands that run a stored instance's machine: which modules they
may import besides those under the machines root (``runtime.loader.Trust``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from ..runtime import Engine


#: ``--machines``: the modules a command may import for stored instances besides those
#: under the machines root (``runtime.loader.Trust``).
MACHINES = typer.Option([], "--machines", metavar="MODULE",
                        help="Machine modules to load for stored instances (repeatable); "
                             "others load only from under $FSM_MACHINES_ROOT (default: the "
                             "current directory).")


def trusting(engine: Engine, machines: Sequence[str]) -> Engine:
    """``engine`` with each of ``machines`` (``--machines``) loaded, so the instances naming
    them run; others load only from under the machines root (``runtime.loader.Trust``).
    The engine is closed when one fails to load (``MachineLoadError``)."""
    try:
        for module in machines:
            engine.load(module)
    except BaseException:
        engine.close()
        raise
    return engine


def refuse_untrusted(engine: Engine, records: Iterable[Any]) -> None:
    """``MachineRefused`` (the engine closed) for the first of ``records`` whose machine
    module this engine may not import: a command refuses it before running anything."""
    try:
        for rec in records:
            engine.check_module(rec)
    except BaseException:
        engine.close()
        raise
