"""``KindSpec``: the declarative half of a kind of step added as a plug-in (issue 37).

A plug-in kind's state is ``State("cool", kind=SPEC)``, ``SPEC`` a frozen value of the
kind's own class with the members below.  The definition never imports a kind: it calls
these, so a kind is checked at load (``definition.check``, each problem prefixed with
the state), exported (``definition.export``: the state's ``"kind"`` entry, which the
fingerprint, the diagrams (a note per state), the coverage report and ``fsm test`` read)
and then stepped by the ``StepKind`` its module registers (``runtime.kinds.base``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class KindSpec(Protocol):
    """What a plug-in kind's spec offers the definition layer.

    ``name``: the kind's name (its ``StepKind.name``); ``problems(state, fields,
    triggers)``: what is wrong with it on the state named ``state`` (context ``fields``,
    the state's declared ``triggers``), empty when nothing is; ``export()``: its
    settings as a JSON-able dict (part of the machine's fingerprint: change it and
    stored instances need a migration); ``note()``: the one-line label diagrams show.
    """

    name: str

    def problems(self, state: str, fields: Sequence[str],
                 triggers: Sequence[str]) -> list[str]: ...

    def export(self) -> dict[str, Any]: ...

    def note(self) -> str: ...
