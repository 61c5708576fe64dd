"""References to actions and guards: a callable, or a name resolved when the machine is
checked (``fsm_engine.definition.check``), and their display names.

The ground floor of ``definition/``: the declarations (``spec``), their export and their
checks all name references the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: An action or a guard: a callable, or its name in the machine's namespace.
Ref = Callable[..., Any] | str


def as_refs(value: Ref | Sequence[Ref] | None) -> tuple[Ref, ...]:
    """Normalise one reference or a sequence of them to a tuple (``None``: ``()``)."""
    if value is None:
        return ()
    if isinstance(value, str) or callable(value):
        return (value,)
    return tuple(value)


def ref_name(ref: Ref | None) -> str | None:
    """A stable display name for an action or guard reference: the name itself, else the
    callable's ``__qualname__`` (``__name__``, ``repr``); ``None`` for ``None``."""
    if ref is None or isinstance(ref, str):
        return ref
    return getattr(ref, "__qualname__", None) or getattr(ref, "__name__", None) or repr(ref)
