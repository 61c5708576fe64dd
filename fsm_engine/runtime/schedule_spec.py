"""When a schedule ticks: its checked parts and the tick arithmetic (pure; no store).

A schedule ticks either on a **cron** expression — five fields (minute hour day month
weekday), or six with a *seconds* field first (``*/10 * * * * *``: every ten seconds), read
by ``croniter`` in the schedule's IANA time zone (``zoneinfo``; a daylight-saving gap skips
the missing wall-clock times, as croniter does) — or **every** fixed interval
(``2s``, ``500ms``, ``10m``, ``1h30m``, ``1d``), its ticks at ``anchor + n * every`` for
every integer ``n`` (``anchor``: the second after the schedule was added).  Ticks are epoch seconds, kept to
the millisecond; ``tick_id`` names a tick's instance.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..durations import parse_duration
from ..errors import InvalidInput

if TYPE_CHECKING:
    from ..store.schedules import ScheduleRow

OVERLAPS = ("skip", "queue", "allow")
CATCHUPS = ("none", "latest", "all")
#: Most ticks ``count_older`` walks through to count a cron schedule's missed ticks (croniter
#: takes ~0.1 ms a tick: a worker back after a long downtime must not walk a year of them).
COUNT_CAP = 100
#: Longest interval (a year) and shortest (a millisecond).
MAX_EVERY_S, MIN_EVERY_S = 366 * 86400.0, 0.001

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def check_name(name: str) -> str:
    """``name`` when it is a schedule name (1-100 of letters, digits, ``_ . -``, starting
    with a letter or digit: it is part of its ticks' instance ids); else ``InvalidInput``."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidInput(f"schedule name {str(name)[:120]!r} is not 1-100 letters, digits, "
                           "'_', '.' or '-' (starting with a letter or digit)")
    return name


def check_choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    """``value`` when it is one of ``allowed``; else ``InvalidInput`` naming them."""
    if value not in allowed:
        raise InvalidInput(f"--{what} {str(value)[:40]!r}: expected one of {', '.join(allowed)}")
    return value


def parse_every(text: str | float) -> float:
    """An interval as seconds: a number of seconds, or text of parts such as ``2s``,
    ``500ms``, ``1h30m`` (``durations``: units ms, s, m, h, d, w); between 1 ms and 366 days, else
    ``InvalidInput``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        read = parse_duration(str(text))
        if read is None:
            raise InvalidInput(f"--every {str(text)[:40]!r}: expected a duration such as 2s, "
                               "500ms, 10m, 1h30m or 1d")
        seconds = read
    if not MIN_EVERY_S <= seconds <= MAX_EVERY_S:  # (NaN fails too)
        raise InvalidInput(f"--every {text!r}: an interval is 1ms to 366d")
    return round(seconds, 3)


def zone(name: str) -> object:
    """The ``ZoneInfo`` named ``name`` (``UTC``, ``Europe/Paris``…); else ``InvalidInput``."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidInput(f"--tz {str(name)[:60]!r}: unknown time zone (an IANA name such "
                           "as UTC or Europe/Paris)") from None


def check_cron(expr: str) -> str:
    """``expr`` (whitespace normalised) when croniter reads it as 5 fields, or 6 with
    seconds first; else ``InvalidInput`` saying why."""
    from croniter import croniter
    fields = str(expr).split()
    if len(fields) not in (5, 6):
        raise InvalidInput(f"--cron {str(expr)[:80]!r}: expected 5 fields (minute hour day "
                           "month weekday), or 6 with seconds first")
    norm = " ".join(fields)
    try:
        croniter(norm, 0.0, second_at_beginning=True).get_next(float)
    except (ValueError, KeyError, TypeError) as exc:  # CroniterError is a ValueError
        reason = " ".join(str(exc).split())[:120]
        raise InvalidInput(f"--cron {norm[:80]!r}: {reason}") from None
    return norm


def _cron(row: ScheduleRow, start: float, *, back: bool = False) -> object:
    from croniter import croniter
    when = datetime.fromtimestamp(start, zone(row.tz))  # type: ignore[arg-type]
    return croniter(row.cron, when, is_prev=back, second_at_beginning=True)


def next_after(row: ScheduleRow, t: float) -> float:
    """The schedule's first tick strictly after ``t`` (epoch seconds)."""
    if row.every_s is not None:
        n = math.floor((t - row.anchor) / row.every_s + 1e-9) + 1
        tick = round(row.anchor + n * row.every_s, 3)
        return tick if tick > t else round(tick + row.every_s, 3)
    return float(_cron(row, math.floor(t)).get_next(float))  # type: ignore[attr-defined]


def ticks(row: ScheduleRow, lo: float, hi: float, limit: int) -> list[float]:
    """The newest ``limit`` ticks in ``[lo, hi]``, oldest first."""
    if hi < lo or limit <= 0:
        return []
    if row.every_s is not None:
        first = math.ceil((lo - row.anchor) / row.every_s - 1e-9)
        last = math.floor((hi - row.anchor) / row.every_s + 1e-9)
        return [round(row.anchor + n * row.every_s, 3)
                for n in range(max(first, last - limit + 1), last + 1)]
    it = _cron(row, math.floor(hi) + 1, back=True)  # ticks are whole seconds
    out: list[float] = []
    while len(out) < limit:
        tick = float(it.get_prev(float))  # type: ignore[attr-defined]
        if tick < lo:
            break
        out.append(tick)
    return out[::-1]


def count_older(row: ScheduleRow, lo: float, before: float) -> int:
    """How many ticks fall in ``[lo, before)`` (a cron schedule's: at most ``COUNT_CAP``)."""
    if before <= lo:
        return 0
    if row.every_s is not None:
        return len(range(*_span(row, lo, before)))
    return len(ticks(row, lo, math.ceil(before) - 1, COUNT_CAP))


def _span(row: ScheduleRow, lo: float, before: float) -> tuple[int, int]:
    assert row.every_s is not None
    first = math.ceil((lo - row.anchor) / row.every_s - 1e-9)
    end = math.ceil((before - row.anchor) / row.every_s - 1e-9)
    return first, max(first, end)


def tick_id(name: str, tick: float) -> str:
    """The id of the instance a tick of schedule ``name`` starts:
    ``NAME-YYYYMMDDTHHMMSSZ`` (``.mmm`` before the ``Z`` for a fractional second)."""
    when = datetime.fromtimestamp(round(tick, 3), UTC)
    ms = when.microsecond // 1000
    return f"{name}-{when:%Y%m%dT%H%M%S}{f'.{ms:03d}' if ms else ''}Z"


_TICK_ID = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,99})-"
                      r"(?P<stamp>\d{8}T\d{6})(?:\.(?P<ms>\d{3}))?Z")


def parse_tick_id(instance_id: str) -> tuple[str, float] | None:
    """``(schedule name, tick)`` of an id ``tick_id`` made (``None``: not one)."""
    m = _TICK_ID.fullmatch(instance_id)
    if m is None:
        return None
    try:
        when = datetime.strptime(m["stamp"], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return m["name"], when.timestamp() + int(m["ms"] or 0) / 1000


def tick_key(name: str, tick: float) -> str:
    """The idempotency key (``Engine.start``'s ``key``) of a tick's instance:
    ``schedule:NAME:ISO-TIME`` (one instance per key and machine, on every backend)."""
    return f"schedule:{name}:{iso(tick)}"


def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 in UTC (``None`` stays ``None``)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def parse_time(text: str, tz: str = "UTC") -> float:
    """An ISO 8601 time as epoch seconds (one without an offset is read in ``tz``); else
    ``InvalidInput``."""
    try:
        when = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"cannot read time {str(text)[:60]!r}: expected ISO 8601, e.g. "
                           "2026-12-07T06:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone(tz))  # type: ignore[arg-type]
    return when.timestamp()
