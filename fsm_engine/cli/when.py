"""Time on the command line: ``fsm start``'s ``--in``, ``--at``, ``--debounce`` and
``--max-wait`` read into ``runtime.start_options`` (every mistake one ``InvalidInput``
line, exit 2, before anything is opened or written)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from ..errors import InvalidInput
from .observe import parse_age


def parse_at(text: str) -> datetime:
    """An ISO 8601 time with its zone (``2030-01-01T09:00+01:00``, ``…Z``) as an aware
    ``datetime``; ``InvalidInput`` for another shape or a time without a zone."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"cannot read start time {text!r}: use ISO 8601 with a zone, "
                           "e.g. 2030-01-01T09:00+00:00"[:300]) from None
    if when.tzinfo is None:
        raise InvalidInput(f"start time {text!r} has no time zone: add one, e.g. "
                           f"{text.strip()}+00:00"[:300])
    return when


def _seconds(text: str | None) -> float | None:
    return None if text is None else parse_age(text)


def start_options(*, key: str | None, delay: str | None, at: str | None, priority: int,
                  debounce_key: str | None, debounce: str | None, max_wait: str | None
                  ) -> Any:
    """The checked ``StartOptions`` of ``fsm start``'s flags (durations as ``parse_age``
    reads them: ``30s``, ``10m``, ``2h``), at the wall clock's now."""
    from ..runtime.start_options import check
    return check(time.time(), key=key, delay=_seconds(delay),
                 at=None if at is None else parse_at(at), priority=priority,
                 debounce_key=debounce_key, debounce=_seconds(debounce),
                 max_wait=_seconds(max_wait))
