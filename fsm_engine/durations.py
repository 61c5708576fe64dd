"""Durations written as text: the one grammar of every flag and option that takes one
(``fsm prune --older-than``, ``fsm start --in``/``--debounce``/``--max-wait``, ``fsm list
--updated-before``, a review link's ``--ttl``, a schedule's ``--every``).

A duration is one or more parts, each a number and a unit — ``ms``, ``s``, ``m``, ``h``,
``d`` or ``w`` (7 days) — summed: ``45s``, ``500ms``, ``1.5h``, ``1h30m``, ``2w``.  Case
and blanks are ignored (``1H 30M``).  No calendar: a day is 86,400 s.
"""

from __future__ import annotations

import re

__all__ = ["UNITS", "parse_duration"]

#: Seconds per unit.
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float | None:
    """``text`` as seconds (a float >= 0), or ``None`` when it is not a duration (the
    caller says so in its own words: which flag, which bounds)."""
    raw = "".join(str(text).split()).lower()
    parts = _PART.findall(raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        return None
    return sum(float(n) * UNITS[u] for n, u in parts)
