"""Machine definitions: declare (``spec``), check (``check``), export (``export``)."""

from .check import Checked, check
from .export import export_machine, fingerprint
from .spec import (
    BUDGET_EXHAUSTED,
    FALLBACK,
    Fire,
    Machine,
    RunInfo,
    State,
    Transition,
    fire,
)

__all__ = ["Machine", "State", "Transition", "Fire", "fire", "RunInfo", "check", "Checked",
           "export_machine", "fingerprint", "FALLBACK", "BUDGET_EXHAUSTED"]
