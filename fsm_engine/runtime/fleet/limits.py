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
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from ...errors import InvalidInput, StoreError
from ...policies import RateLimit
from .queues import MAX_COUNT, QUEUE_NAME, tighter
from .rates import parse_named

log = logging.getLogger("fsm_engine")

#: Seconds a worker keeps the stored limits before reading them again.
REFRESH_S = 2.0


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
        """Decode a stored object (``StoredLimits``); ``StoreError`` naming every problem
        on one line when it is not one."""
        if value is None:
            return cls()
        try:
            got = StoredLimits.model_validate(value)
        except ValidationError as exc:
            if any(not e["loc"] for e in exc.errors()):
                raise StoreError("stored fleet limits are not a JSON object: "
                                 f"{value!r:.80}") from None
            raise StoreError("stored fleet limits are unusable: "
                             + "; ".join(map(_problem, exc.errors()))) from None
        return cls(dict(got.queue_limits or {}), got.partition_limit,
                   {name: RateLimit(**r.model_dump()) for name, r in
                    (got.rate_limits or {}).items()})

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


#: A queue's name: all of it matches ``QUEUE_NAME`` (a pydantic pattern matches a prefix).
_Queue = Annotated[str, StringConstraints(pattern=f"^(?:{QUEUE_NAME.pattern})$")]
_Count = Annotated[StrictInt, Field(ge=1, le=MAX_COUNT)]
#: Most calls or tokens of a stored rate limit: what an SQL ``BIGINT`` holds.
_Many = Annotated[StrictInt, Field(ge=1, le=2**63 - 1)]
_Seconds = Annotated[StrictFloat, Field(gt=0)]


class StoredRate(BaseModel):
    """One stored rate limit (``RateLimit``'s fields, strict: no text for a number, finite
    seconds > 0, ``rpm`` or ``tpm`` given); other keys are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rpm: _Many | None = None
    tpm: _Many | None = None
    window_s: _Seconds = 60.0
    hold_s: _Seconds = 300.0

    @model_validator(mode="after")
    def _some_limit(self) -> StoredRate:
        if self.rpm is None and self.tpm is None:
            raise ValueError("give rpm, tpm or both")
        return self


class StoredLimits(BaseModel):
    """The stored object (the module doc's shape, ``FleetLimits.to_json``): every key
    optional (``null``: none), queue names as ``QUEUE_NAME``, counts 1..``MAX_COUNT``;
    other keys are refused (a newer fsm_engine's limit is not silently dropped)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_limits: dict[_Queue, _Count] | None = None
    partition_limit: _Count | None = None
    rate_limits: dict[str, StoredRate] | None = None


def _problem(error: ErrorDetails) -> str:
    """One problem of a ``StoredLimits`` read: where (``rate_limits['p'].rpm``), the value
    and what is wrong with it."""
    loc = [p for p in error["loc"] if p != "[key]"]
    if error["type"] == "extra_forbidden" and len(loc) == 1:
        return f"unknown key {loc[0]!r}"
    where = "".join([str(loc[0]), *(f"[{p!r}]" if i == 1 else f".{p}"
                                     for i, p in enumerate(loc[1:], start=1))])
    return f"{where} {error['input']!r:.40}: {error['msg']}"


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
