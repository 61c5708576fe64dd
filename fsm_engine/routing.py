"""Model-driven routing: map a model's free text onto one of the declared triggers.

The model never names a state: it can only pick among the triggers the
current state declares (``step.triggers``).  Anything else maps to the
default, so a hallucinated route cannot leave the diagram.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


def choose_trigger(text: str, allowed: Sequence[str], default: str) -> str:
    """The first allowed trigger named in ``text`` (whole word, case-insensitive), else ``default``.

    Raises ``ValueError`` when ``default`` is not in ``allowed``.
    """
    if default not in allowed:
        raise ValueError(f"default trigger {default!r} is not among {list(allowed)}")
    found = [(m.start(), t) for t in allowed
             for m in [re.search(rf"\b{re.escape(t)}\b", text, re.IGNORECASE)] if m]
    return min(found)[1] if found else default
