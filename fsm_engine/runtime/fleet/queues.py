"""Which work a worker takes: the queues it serves and the limits per queue and partition.

An instance's queue is the queue of its current state (``State(..., queue="llm")``,
default ``"default"``), stored on the instance and changed in the commit that
moves it.  A worker (``fsm worker``) is configured by a ``QueuePlan``:

- ``serve``: the queues it claims from (``--queue llm --queue io``; none: every queue);
- ``total``: the most instances it steps at once (``--concurrency 64``);
- ``per_queue``: the most at once per queue in this worker (``--concurrency llm=4,io=32``);
- ``global_limits``: the most at once per queue over every worker, counted through the
  store in the claim's transaction (``--queue-limit llm=8``);
- ``partition_limit``: the most instances of one partition key held at once over every
  worker (``--partition-limit 2``); free slots go to the least-loaded partitions first.

A worker claims each limited queue on its own (with that queue's free slots) and
the other queues together.  When a step moves an instance into a queue this worker
does not serve, or one that is limited (globally, or here and full), the same
commit gives the instance back (``Driver.hand_off``): it is claimed again under
that queue's limits, by whichever worker has room.  Moving between unlimited queues
it serves, a worker simply goes on.  Global and partition limits are best stored
once for the whole fleet (``fsm limits``, ``runtime.fleet.limits``): every worker obeys
those, tightened by its own flags (``QueuePlan.tightened``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from ...errors import InvalidInput

#: A queue's name: a letter, then up to 63 letters, digits, ``_`` or ``-``.
QUEUE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
#: The largest count a limit may have (instances at once).
MAX_COUNT = 1_000_000


class StoredLimits(Protocol):
    """What a plan is tightened by: the fleet's stored limits (``limits.FleetLimits``), per
    queue and for partitions (counts are instances; ``None``: no limit)."""

    @property
    def queue_limits(self) -> Mapping[str, int]: ...

    @property
    def partition_limit(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class QueueClaim:
    """One claim a worker makes: only ``queues`` (``None``: any) but not ``skip``, up to
    ``limit`` instances, under ``queue_limit`` live leases of the one queue over all
    workers (``None``: no global limit)."""

    queues: tuple[str, ...] | None
    skip: tuple[str, ...]
    limit: int
    queue_limit: int | None = None


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """A worker's queues and limits (see the module doc); counts are instances."""

    total: int = 32
    serve: tuple[str, ...] | None = None
    per_queue: Mapping[str, int] = field(default_factory=dict)
    global_limits: Mapping[str, int] = field(default_factory=dict)
    partition_limit: int | None = None

    @property
    def limited(self) -> tuple[str, ...]:
        """Queues with a limit of their own (claimed one by one), sorted."""
        return tuple(sorted(set(self.per_queue) | set(self.global_limits)))

    def tightened(self, fleet: StoredLimits) -> QueuePlan:
        """This plan under the fleet's stored limits: per queue and for partitions, the
        smaller of this worker's limit and the stored one."""
        queues = sorted(set(self.global_limits) | set(fleet.queue_limits))
        limits = {q: limit for q in queues  # each is set on one side at least: never None
                  if (limit := tighter(self.global_limits.get(q), fleet.queue_limits.get(q))) is not None}
        return replace(self, global_limits=limits,
                       partition_limit=tighter(self.partition_limit, fleet.partition_limit))

    def serves(self, queue: str) -> bool:
        """True when this worker takes instances in ``queue``."""
        return self.serve is None or queue in self.serve

    def claims(self, running: Counter[str]) -> list[QueueClaim]:
        """The claims filling this worker's free slots, given how many instances of each
        queue it runs now (limited queues first, each with its own free slots; the
        others share what is left of ``total`` — the caller lowers that as claims fill)."""
        free = self.total - sum(running.values())
        if free <= 0:
            return []
        out = []
        for q in self.limited:
            if not self.serves(q):
                continue
            room = min(free, self.per_queue.get(q, self.total) - running[q])
            if room > 0:
                out.append(QueueClaim((q,), (), room, self.global_limits.get(q)))
        if self.serve is None:
            out.append(QueueClaim(None, self.limited, free))
        else:
            rest = tuple(q for q in self.serve if q not in self.limited)
            if rest:
                out.append(QueueClaim(rest, (), free))
        return out

    def hands_off(self, queue: str, running: Counter[str]) -> bool:
        """True when an instance moving into ``queue`` must be given back rather than
        run on here (not served, limited over all workers, or full here)."""
        if not self.serves(queue) or queue in self.global_limits:
            return True
        return queue in self.per_queue and running[queue] >= self.per_queue[queue]


def parse_counts(values: list[str], what: str) -> tuple[int | None, dict[str, int]]:
    """``["64"]`` / ``["llm=4,io=32"]`` (comma-separated or repeated) as (a bare total or
    None, per-queue counts); ``InvalidInput`` naming ``what`` (the option) otherwise."""
    total, per = None, {}
    for item in (i.strip() for v in values for i in v.split(",")):
        name, sep, count = item.rpartition("=")
        if not count.isdigit() or not 1 <= int(count) <= MAX_COUNT or (
                sep and not QUEUE_NAME.fullmatch(name)):
            raise InvalidInput(f"{what} {item!r}: expected N or QUEUE=N (1 <= N <= "
                               f"{MAX_COUNT:,})")
        if sep:
            per[name] = int(count)
        else:
            total = int(count)
    return total, per


def check_queue(name: str) -> str:
    """``name`` when it is a queue name, else ``InvalidInput``."""
    if not QUEUE_NAME.fullmatch(name):
        raise InvalidInput(f"--queue {name!r}: a queue name is a letter, then letters, "
                           "digits, '_' or '-'")
    return name


def tighter(mine: int | None, stored: int | None) -> int | None:
    """The smaller of two limits (``None``: no limit)."""
    return stored if mine is None else mine if stored is None else min(mine, stored)
