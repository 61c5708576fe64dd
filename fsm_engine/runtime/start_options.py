"""How an instance is started (issue 38): once per key, later, after a burst, ahead of others.

``Engine.start`` takes these options (``fsm start`` has a flag for each):

- ``key`` (**idempotent start**): the instance's ``start_key``, unique per machine.  A
  second start with the key returns the first instance's id and writes nothing; with
  another input it raises ``StartConflict`` naming that instance.  The store's unique
  index decides (``Store.create`` raises ``StartKeyTaken``), never a read before the
  write, so concurrent starts from many processes make one instance.
- ``delay`` (seconds) or ``at`` (an aware ``datetime``) (**delayed start**): the instance
  is created ``scheduled``, unowned, its due time in ``next_attempt_at``; no claim takes
  it before then (``store.claims.where``), then it runs as a ``pending`` one would.
  ``fsm cancel`` cancels it meanwhile.
- ``debounce_key`` with ``debounce`` (seconds) and optionally ``max_wait`` (seconds)
  (**debounce**): starts with the same key while one of them is still ``scheduled``
  collapse into that one instance: its input becomes the latest and its start moves to
  ``debounce`` seconds after the latest start, never later than ``max_wait`` after the
  first (``Store.debounce``, one atomic write: at most one scheduled instance per machine
  and key, a partial unique index).  Exactly one instance runs per burst.  A delayed or
  debounced start cancelled before its time and then restarted (``Engine.restart``) is
  ``scheduled`` again for that time while it is still ahead, else it starts at once
  (``rescheduled``).  A paused or
  cancelled one is out of its burst (the next start opens a new one): unpausing or
  restarting it back to ``scheduled`` while a newer burst of its key is scheduled is
  refused (``DebounceKeyTaken``, ``reschedulable``).
- ``priority`` (an integer, ``PRIORITY_MIN`` … ``PRIORITY_MAX``, default 0): every
  claim takes the instance with the lowest ``rank = created_at - priority * AGING_S``
  first (``store.records.AGING_S``): higher priority first, then age, within the queue
  and partition limits.  Starvation is bounded: an instance of priority ``p`` is
  overtaken only by instances started less than ``(p_max - p) * AGING_S`` seconds after
  it.

Every error is an ``InvalidInput`` (one line) raised before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..errors import DebounceKeyTaken, InvalidInput, StartConflict, StartKeyTaken
from ..store import details
from ..store.base import Store
from ..store.records import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    SCHEDULED,
    HistoryRow,
    InstanceRecord,
    StepCommit,
)
from .ledger import Ledger

#: Longest start key and debounce key (characters).
MAX_KEY = 200
#: Longest delay, debounce window or max wait (seconds: ten years).
MAX_DELAY_S = 10 * 365 * 86400.0


@dataclass(frozen=True, slots=True)
class StartOptions:
    """Checked start options (see the module): ``due`` is the epoch second a delayed
    start is due (``None``: at once); ``debounce_s`` / ``max_wait_s`` in seconds."""

    key: str | None = None
    due: float | None = None
    priority: int = 0
    debounce_key: str | None = None
    debounce_s: float | None = None
    max_wait_s: float | None = None

    @property
    def plain(self) -> bool:
        """True when these options change nothing about a start."""
        return self == _PLAIN


_PLAIN = StartOptions()


def _key(what: str, key: str | None) -> str | None:
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_KEY):
        raise InvalidInput(f"a {what} is 1 to {MAX_KEY} characters, not {key!r}"[:300])
    return key


def _seconds(what: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{what} must be a number of seconds, not {value!r}"[:300])
    if value < 0 or value > MAX_DELAY_S:
        raise InvalidInput(f"{what} must be 0 to {MAX_DELAY_S:.0f} seconds, not {value:g}")
    return float(value)


def _due(now: float, delay: float | None, at: datetime | None) -> float | None:
    if delay is not None and at is not None:
        raise InvalidInput("give a delay or a start time (at), not both")
    if at is None:
        seconds = _seconds("a start delay", delay)
        return None if not seconds else now + seconds
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise InvalidInput(f"a start time needs its time zone (an aware datetime), not {at!r}"
                           [:300])
    due = at.timestamp()
    if due < now:
        raise InvalidInput(f"start time {at.isoformat()} has passed")
    if due - now > MAX_DELAY_S:  # the bound a delay has: a start time is a delay too
        raise InvalidInput(f"start time {at.isoformat()} is more than {MAX_DELAY_S:.0f} "
                           "seconds (10 years) away")
    return due


def _priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
            PRIORITY_MIN <= priority <= PRIORITY_MAX):
        raise InvalidInput(f"a priority is an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, "
                           f"not {priority!r}"[:300])
    return priority


def check(now: float, *, key: str | None = None, delay: float | None = None,
          at: datetime | None = None, priority: int = 0, debounce_key: str | None = None,
          debounce: float | None = None, max_wait: float | None = None) -> StartOptions:
    """The options of one start at ``now`` (epoch seconds), checked; ``InvalidInput`` for a
    key that is empty or over ``MAX_KEY`` characters, a negative or non-finite delay, an
    ``at`` without a time zone or already past, both ``delay`` and ``at``, a priority out
    of range, a debounce key without its window (or a window without its key), a
    ``max_wait`` shorter than the window, or a debounce with a start key or delay."""
    opts = StartOptions(key=_key("start key", key), due=_due(now, delay, at),
                        priority=_priority(priority),
                        debounce_key=_key("debounce key", debounce_key),
                        debounce_s=_seconds("a debounce window", debounce),
                        max_wait_s=_seconds("a debounce max wait", max_wait))
    if (opts.debounce_key is None) != (opts.debounce_s is None):
        raise InvalidInput("a debounce needs both its key and its window")
    if opts.max_wait_s is not None and opts.debounce_s is None:
        raise InvalidInput("a max wait belongs to a debounce (give its key and window)")
    if opts.debounce_key is not None:
        if opts.key is not None or opts.due is not None:
            raise InvalidInput("a debounced start takes no start key, delay or start time")
        if opts.max_wait_s is not None and opts.max_wait_s < (opts.debounce_s or 0.0):
            raise InvalidInput("a debounce's max wait is shorter than its window")
    return opts


def apply(rec: InstanceRecord, opts: StartOptions) -> None:
    """Give the new record ``rec`` what ``opts`` ask: its key and priority; a delayed or
    debounced start is ``scheduled``, unowned, due at ``next_attempt_at``."""
    rec.start_key, rec.priority = opts.key, opts.priority
    rec.rank = None  # the store sets it from created_at and priority
    due = opts.due
    if opts.debounce_s is not None:
        rec.debounce_key = opts.debounce_key
        due = rec.created_at + opts.debounce_s
        if opts.max_wait_s is not None:
            rec.debounce_until = rec.created_at + opts.max_wait_s
    if due is not None:
        rec.status, rec.next_attempt_at, rec.owner = SCHEDULED, due, None


def keyed(records: Sequence[InstanceRecord], keys: Sequence[str]) -> None:
    """Give each new record its start key (``Engine.start_many``'s ``keys``: one per
    record, each 1–``MAX_KEY`` characters, else ``InvalidInput``)."""
    if len(keys) != len(records):
        raise InvalidInput(f"{len(keys)} start keys for {len(records)} inputs")
    for rec, key in zip(records, keys, strict=True):
        rec.start_key = _key("start key", key)


def create_all(ledger: Ledger, records: Sequence[InstanceRecord], opts: StartOptions
               ) -> list[str]:
    """``apply`` ``opts`` to the new ``records`` and write them (one transaction); the ids
    of the instances standing for them (``create``).  A key or a debounce applies to one
    input only (``InvalidInput``)."""
    if (opts.key is not None or opts.debounce_key is not None) and len(records) != 1:
        raise InvalidInput(f"a start key or debounce applies to one input, not {len(records)}")
    for rec in records:
        apply(rec, opts)
    if len(records) == 1:
        return [create(ledger, records[0], opts)]
    ledger.create(records)
    return [r.id for r in records]


def create(ledger: Ledger, rec: InstanceRecord, opts: StartOptions) -> str:
    """Write the new instance ``rec`` (``apply``-ed) as ``opts`` ask; the id of the instance
    that stands for it: its own, or the one its key or debounce key names.  Raises
    ``StartConflict`` for a key held with another input, else what ``Ledger.create``
    raises."""
    if opts.debounce_s is not None:
        return ledger.create([rec], fold=True)[0]
    if rec.start_key is None:
        ledger.create([rec])
        return rec.id
    for _ in range(3):  # the holder may be pruned between the refusal and the read
        try:
            ledger.create([rec])
            return rec.id
        except StartKeyTaken:
            held = ledger.store.by_start_key(rec.machine, rec.start_key)
        if held is not None:
            if held.input != rec.input:
                raise StartConflict(rec.machine, rec.start_key, held.id)
            return held.id
    raise StartKeyTaken(rec.machine, rec.start_key)


def reschedulable(store: Store, rec: InstanceRecord) -> None:
    """Check that ``rec`` (paused or cancelled) may be ``scheduled`` again: raises
    ``DebounceKeyTaken`` (one line, naming the holder) when it is a debounced start and
    another instance holds its machine's scheduled slot of that key — a newer burst, which
    the store's partial unique index would refuse (a traceback-deep integrity error).  One
    indexed read (``Store.by_debounce_key``); a start racing in after it is still refused
    by the index (the step is rejected whole, nothing written)."""
    if rec.debounce_key is None:
        return
    holder = store.by_debounce_key(rec.machine, rec.debounce_key)
    if holder is not None and holder.id != rec.id:
        raise DebounceKeyTaken(rec.id, rec.machine, rec.debounce_key, holder.id)


def rescheduled(store: Store, step: StepCommit, cancel: HistoryRow, now: float) -> StepCommit:
    """``step`` (the restart of a cancelled instance, ``Client.restarted``) ``scheduled``
    again, unowned, for the due time its ``cancel`` row kept (``detail.scheduled_due``,
    epoch s: it was a delayed or debounced start not started yet) when that is still
    after ``now``; else ``step`` as it is (it runs at once).  The restart's row records
    it (``detail.scheduled_due``); its state's timers are armed when it starts.  Raises
    ``DebounceKeyTaken`` for a debounced start whose key has a newer burst
    (``reschedulable``)."""
    due = details.read(details.CancelDetail, cancel.detail).get("scheduled_due") \
        if cancel.kind == "cancel" else None
    if due is None or due <= now:
        return step
    new = step.record
    reschedulable(store, new)
    new.status, new.next_attempt_at, new.owner = SCHEDULED, due, None
    row = step.history[0]
    row.detail.pop("timers", None)  # armed when it starts (``kinds.timers.armed``)
    row.detail["scheduled_due"] = due
    return step
