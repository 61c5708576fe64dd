"""Fan-out families run here: a waiting parent's children stepped in this process until
the parent has a step to take (its join or a top-up), ends, or is left waiting.

Owned by the runner (``runtime.runner``): it hands ``Families.run`` the coroutine factory
that runs one child, and reads ``parents`` / ``hosts`` / ``born`` around its runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ...definition.fanout import CHILDREN
from ...store import Store
from ...store.records import RATE_LIMITED, WAITING, ChildState, InstanceRecord
from ..compiled import CompiledMachine
from ..fleet.ownership import Ownership
from . import fanout, timers


def _runnable(kid: ChildState, parked: set[str]) -> bool:
    """True when a run of ``kid`` (not final, free) can move it: it is not waiting, or it
    waits on something its run here waits out (its own family, a rate limit) and did not
    come back waiting from a run here already (``parked``).  A child waiting for a
    review's decision or a trigger moves only from outside."""
    if kid.status != WAITING:
        return True
    return kid.reason in (CHILDREN, RATE_LIMITED) and kid.id not in parked


class Families:
    """The fan-out families this process runs.

    Args:
        busy: True for an instance id a task here runs or is about to.
    """

    def __init__(self, store: Store, ownership: Ownership, lease_seconds: float,
                 busy: Callable[[str], bool]) -> None:
        self.store, self.ownership, self.lease_seconds, self.busy = \
            store, ownership, lease_seconds, busy
        self.kids: dict[str, asyncio.Future[Any]] = {}  # children run for waiting parents
        self.parents: set[str] = set()  # parents a run here continues
        #: Parents whose run here runs their children too: their new children are created
        #: owned by this worker (no claim) and handed over in ``born``.
        self.hosts: set[str] = set()
        self.born: dict[str, InstanceRecord] = {}
        self.ended: dict[str, asyncio.Event] = {}  # per waiting parent: a child ended

    def adopt_born(self, records: Sequence[InstanceRecord]) -> None:
        """``Driver.born``: children just created owned here, kept for their first run."""
        self.born.update((r.id, r) for r in records if r.owner is not None)

    async def run(self, cm: CompiledMachine, parent: InstanceRecord,
                  one: Callable[[str], Any]) -> InstanceRecord:
        """Run ``parent``'s current children here until it has a step to take (its join or
        a top-up: ``fanout.needs_step``; other wakes are skipped), ends, or is left
        waiting, or its timer (``kinds.timers``) is due; return it.

        Children another live worker holds are left to it (polled every
        ``lease_seconds / 3``); children of children run the same way.  A child waiting
        for a decision, a trigger or its own waiting family is not run again until it
        moves: when every child left waits, the parent is returned still waiting.  Once
        the family has joined (or the parent ended), children still running here are
        stopped (the join or the cancellation already ended them in the store).
        """
        poll = max(0.05, self.lease_seconds / 3)
        ended = self.ended.setdefault(parent.id, asyncio.Event())
        parked: set[str] = set()  # children whose run here left them waiting
        kids: list[ChildState] = []
        due = timers.due_of(cm, self.store, parent)  # its timer's (kept over the wakes)
        try:
            while True:
                ended.clear()  # before the read: a child ending after it sets it again
                rec = self.store.get(parent.id)
                if rec.final or rec.status not in ("waiting", "running") \
                        or rec.reason != CHILDREN:
                    break
                states = self.store.child_states(parent.id)
                if rec.status == "running" and fanout.needs_step(cm, rec, states):
                    break  # woken with something to do
                left = poll if due is None else due - self.ownership.clock()
                if left <= 0:
                    break  # its timer is due: the parent's step fires it
                kids = fanout.current(parent.id, states)
                if not self._spawn(rec, kids, one, parked):
                    break  # every child left waits: so does the parent
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ended.wait(), min(poll, left))
        finally:
            self.ended.pop(parent.id, None)
        if rec.final or rec.reason != CHILDREN:
            self._drop({k.id for k in kids})
        return rec

    def _drop(self, ids: set[str]) -> None:
        """Stop the children ``ids`` still running here and forget the ones born here."""
        for kid_id, fut in list(self.kids.items()):
            if kid_id in ids:
                fut.cancel()
        for kid_id in [k for k in self.born if k in ids]:
            del self.born[kid_id]

    def _spawn(self, parent: InstanceRecord, kids: Iterable[ChildState],
               one: Callable[[str], Any], parked: set[str]) -> bool:
        """Start here each child of ``parent``'s current fan-out (``kids``) not running
        here that no live worker holds and that can move (``_runnable``); a child's end
        sets ``parent``'s event in ``_ended``.  False when nothing is left to wait for
        here: every child not final waits (``parked``: run here and left waiting)."""
        busy = False
        for kid in kids:
            if kid.final:
                continue
            if kid.status != WAITING:
                parked.discard(kid.id)  # it moved: run it again when it waits anew
            if kid.id in self.kids or self.busy(kid.id):
                busy = True
            elif not self.ownership.can_take(kid):
                busy = True  # another live worker runs it: poll
            elif _runnable(kid, parked):
                self.kids[kid.id] = fut = asyncio.ensure_future(one(kid.id))
                fut.add_done_callback(
                    functools.partial(self._kid_done, parent.id, kid.id, parked))
                busy = True
        return busy

    def _kid_done(self, parent_id: str, kid_id: str, parked: set[str],
                  fut: asyncio.Future[Any]) -> None:
        self.kids.pop(kid_id, None)
        if not fut.cancelled() and fut.exception() is None:
            rec = fut.result()
            if isinstance(rec, InstanceRecord) and rec.status == WAITING:
                parked.add(kid_id)
        ended = self.ended.get(parent_id)
        if ended is not None:
            ended.set()

