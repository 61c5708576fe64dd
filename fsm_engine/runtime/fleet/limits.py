"""Fleet limits: queue, partition and rate limits kept in the store, obeyed by every worker.

Limits that bind a whole fleet are a property of the store the fleet shares, not of
one worker's command line: ``fsm limits --queue-limit llm=8 --partition-limit 2
--rate-limit primary=tpm:40000`` writes them once (one JSON object, ``Store.put_limits``),
and every ``fsm worker`` reads them again at most ``REFRESH_S`` seconds after they change,
so a worker started without flags, or started before a limit changed, still obeys them.
An engine that runs instances in its own process (``fsm run --local``, ``Engine.run_many``)
reads the stored rate limits when it first runs.

A worker's own ``--queue-limit`` / ``--partition-limit`` / ``--rate-limit`` can only
tighten what is stored: for each queue, the partition limit and each field of a rate
limit (``rpm``, ``tpm``), the smaller wins; a rate limit's window and hold come from the
stored one when both exist.

Stored shape (JSON; every key optional)::

    {"queue_limits": {"llm": 8}, "partition_limit": 2,
     "rate_limits": {"primary": {"rpm": 500, "tpm": 40000, "window_s": 60, "hold_s": 300}}}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...errors import InvalidInput, StoreError
from ...policies import RateLimit
from .queues import MAX_COUNT, QUEUE_NAME, tighter
from .rates import parse_named

log = logging.getLogger("fsm_engine")

#: Seconds a worker keeps the stored limits before reading them again.
REFRESH_S = 2.0
_RATE_FIELDS = ("rpm", "tpm", "window_s", "hold_s")


@dataclass(frozen=True)
class FleetLimits:
    """Limits over every worker of a store (see the module doc).

    Attributes:
        queue_limits: most instances leased at once per queue, over all workers.
        partition_limit: most instances of one partition key leased at once (None: none).
        rate_limits: shared rate limits by model name (a ``--llm`` name, ``"*"`` for the
            default provider, or ``provider:model``).
    """

    queue_limits: Mapping[str, int] = field(default_factory=dict)
    partition_limit: int | None = None
    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """True when no limit is set."""
        return not (self.queue_limits or self.partition_limit or self.rate_limits)

    def to_json(self) -> dict[str, Any]:
        """The stored JSON object (keys of unset limits left out)."""
        out: dict[str, Any] = {}
        if self.queue_limits:
            out["queue_limits"] = dict(sorted(self.queue_limits.items()))
        if self.partition_limit is not None:
            out["partition_limit"] = self.partition_limit
        if self.rate_limits:
            out["rate_limits"] = {name: asdict(limit)
                                  for name, limit in sorted(self.rate_limits.items())}
        return out

    @classmethod
    def from_json(cls, value: Any) -> FleetLimits:
        """Decode a stored object; ``StoreError`` naming every problem when it is not one."""
        problems: list[str] = []
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise StoreError(f"stored fleet limits are not a JSON object: {value!r:.80}")
        problems += [f"unknown key {k!r}" for k in value
                     if k not in ("queue_limits", "partition_limit", "rate_limits")]
        queues = value.get("queue_limits") or {}
        if not isinstance(queues, dict):
            problems.append("queue_limits is not an object")
            queues = {}
        problems += [f"queue limit {q!r}: {n!r} is not a name and an int >= 1"
                     for q, n in queues.items() if not QUEUE_NAME.fullmatch(str(q)) or not _count(n)]
        partition = value.get("partition_limit")
        if partition is not None and not _count(partition):
            problems.append(f"partition_limit {partition!r} is not an int >= 1")
        rates: dict[str, RateLimit] = {}
        raw = value.get("rate_limits") or {}
        for name, spec in (raw.items() if isinstance(raw, dict) else []):
            limit = _rate(spec)
            if isinstance(limit, str):
                problems.append(f"rate limit {name!r}: {limit}")
            else:
                rates[name] = limit
        if not isinstance(raw, dict):
            problems.append("rate_limits is not an object")
        if problems:
            raise StoreError("stored fleet limits are unusable: " + "; ".join(problems))
        return cls(dict(queues), partition, rates)

    def changed(self, *, queue_limits: Mapping[str, int | None] = {},
                partition_limit: int | None | str = "keep",
                rate_limits: Mapping[str, RateLimit | None] = {}) -> FleetLimits:
        """A copy with these set (a value of ``None`` removes that limit)."""
        queues = {**self.queue_limits, **queue_limits}
        rates = {**self.rate_limits, **rate_limits}
        return FleetLimits(
            {q: n for q, n in queues.items() if n is not None},
            self.partition_limit if partition_limit == "keep" else partition_limit,  # type: ignore[arg-type]
            {m: r for m, r in rates.items() if r is not None})


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COUNT


def _rate(spec: Any) -> RateLimit | str:
    """A stored rate limit, or what is wrong with it."""
    if not isinstance(spec, dict) or set(spec) - set(_RATE_FIELDS):
        return f"expected an object with {', '.join(_RATE_FIELDS)}"
    try:
        limit = RateLimit(**spec)
    except TypeError as exc:
        return str(exc)
    return "; ".join(limit.problems()) or limit


def merge_rates(mine: Mapping[str, RateLimit],
                stored: Mapping[str, RateLimit]) -> dict[str, RateLimit]:
    """Rate limits by name: the stored ones, tightened field by field by this process's."""
    out = dict(mine)
    for name, limit in stored.items():
        own = out.get(name)
        out[name] = limit if own is None else replace(
            limit, rpm=tighter(own.rpm, limit.rpm), tpm=tighter(own.tpm, limit.tpm))
    return out


def read(store: Any) -> FleetLimits | None:
    """The store's fleet limits; ``None`` when the store cannot be read just now (the
    caller keeps what it had, logged).  Unusable stored limits raise ``StoreError``'s
    message into the log once per read and count as none."""
    try:
        return FleetLimits.from_json(store.get_limits())
    except StoreError as exc:
        log.warning("fleet limits unreadable, keeping the previous ones: %s", exc)
        return None


def parse_queue_limits(values: list[str]) -> dict[str, int | None]:
    """``["llm=8,io=none"]`` as ``{"llm": 8, "io": None}`` (``none``: remove);
    ``InvalidInput`` naming the bad item."""
    out: dict[str, int | None] = {}
    for item in (i.strip() for v in values for i in v.split(",") if i.strip()):
        name, sep, count = item.partition("=")
        if not sep or not QUEUE_NAME.fullmatch(name) or not (
                count == "none" or (count.isdigit() and 1 <= int(count) <= MAX_COUNT)):
            raise InvalidInput(f"--queue-limit {item!r}: expected QUEUE=N (1 <= N <= "
                               f"{MAX_COUNT:,}) or QUEUE=none")
        out[name] = None if count == "none" else int(count)
    return out


def parse_rate_limits(values: list[str]) -> dict[str, RateLimit | None]:
    """``["primary=tpm:40000", "default=none"]`` by model name (``default``/``*``: the
    default provider; ``none``: remove); ``InvalidInput`` naming the bad value."""
    return dict(parse_named(value, removable=True) for value in values)


def parse_partition_limit(value: str | None) -> int | None | str:
    """``--partition-limit``: ``"keep"`` when absent, ``None`` for ``none``, else N;
    ``InvalidInput`` otherwise."""
    if value is None:
        return "keep"
    if value == "none":
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_COUNT:
        raise InvalidInput(f"--partition-limit {value!r}: expected N (1 <= N <= "
                           f"{MAX_COUNT:,}) or none")
    return int(value)
