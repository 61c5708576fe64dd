"""Timer edges (issue 38): ``Transition(..., after=...)`` read as data.

A timer edge fires by itself once its source state has been current for its delay and
nothing else left it.  Its delay (``Transition.after``) is seconds (``int``/``float``), a
``timedelta``, or a callable of the context returning seconds or an aware ``datetime``
(evaluated once, at entry: ``runtime.kinds.timers``).

One *timer* is a (source, trigger) pair: every edge of that trigger out of that source
is a timer edge with the same delay (its guards choose among them when it fires, as for
any trigger).  Refused at load (``problems``): a timer out of a state that does not wait
(only ``wait=True``, review and fan-out states wait), a delay that is not positive, a
callable that does not take the context, a trigger that is a timer's on one edge and not
on another edge out of the same source.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .kind import kinds_of
from .refs import ref_name

if TYPE_CHECKING:
    from .spec import Machine, State, Transition

#: ``Transition.after``: seconds, a ``timedelta``, or ``fn(ctx) -> seconds | datetime``.
After = Any


def constant_s(after: After) -> float | None:
    """``after`` in seconds when it is a constant (a number or a ``timedelta``), else None
    (a callable: known only at entry)."""
    if isinstance(after, timedelta):
        return after.total_seconds()
    if isinstance(after, (int, float)) and not isinstance(after, bool):
        return float(after)
    return None


def waits(state: State) -> bool:
    """True when ``state`` waits (holding no worker): a timer may leave it (its kind's
    ``waits``, ``definition.kind``: wait, review, fan-out)."""
    return any(k.waits for k in kinds_of(state))


def label(after: After) -> str:
    """A short text for ``after`` in a diagram: ``90s``, ``30m``, ``2h``, ``1d``, ``1.5s``;
    a callable's name with ``()`` (``due_in()``)."""
    seconds = constant_s(after)
    if seconds is None:
        return f"{ref_name(after) or getattr(after, '__name__', 'after')}()"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def export(after: After) -> float | str:
    """``after`` as plain data (the export and the fingerprint): seconds, or the
    callable's name as ``"callable:NAME"``."""
    seconds = constant_s(after)
    return seconds if seconds is not None else f"callable:{label(after)[:-2]}"


def by_state(machine: Machine) -> dict[str, list[tuple[str, After]]]:
    """Each waiting state's timers: state -> ``[(trigger, after), ...]`` in declaration
    order (one per trigger, the first edge's delay)."""
    names = [s.name for s in machine.states]
    out: dict[str, list[tuple[str, After]]] = {}
    for t in machine.transitions:
        if t.after is None:
            continue
        for src in t.sources(names, machine.finals):
            timers = out.setdefault(src, [])
            if all(trigger != t.trigger for trigger, _ in timers):
                timers.append((t.trigger, t.after))
    return out


def _delay_problem(after: After) -> str | None:
    seconds = constant_s(after)
    if seconds is not None:
        if not math.isfinite(seconds) or seconds <= 0:
            return f"after must be a positive delay, not {after!r}"
        return None
    if not callable(after):
        return (f"after must be seconds, a timedelta or a callable of the context, "
                f"not {type(after).__name__}")
    try:
        params = [p for p in inspect.signature(after).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    if not params or sum(p.default is p.empty for p in params) > 1:
        return f"after {label(after)!r} must take the context (one argument)"
    return None


def problems(machine: Machine, transitions: list[Transition],
             label_of: Callable[[Transition], str]) -> list[str]:
    """Every problem of ``machine``'s timer edges, each naming its transition."""
    names = [s.name for s in machine.states]
    states = {s.name: s for s in machine.states}
    out: list[str] = []
    timed: dict[tuple[str, str], bool] = {}
    for t in transitions:
        for src in t.sources(names, machine.finals):
            key = (src, t.trigger)
            if timed.setdefault(key, t.after is not None) != (t.after is not None):
                out.append(f"transition {label_of(t)}: trigger {t.trigger!r} out of {src!r} "
                           "is a timer's on one edge and not on another")
            if t.after is not None and src in states and not waits(states[src]):
                out.append(f"transition {label_of(t)}: a timer (after=) needs a state that "
                           f"waits (wait=True, a review or a fan-out); {src!r} does not")
        if t.after is not None and (why := _delay_problem(t.after)) is not None:
            out.append(f"transition {label_of(t)}: {why}")
    return out
