"""The lease fence: the one check a worker makes where an action or a tool actually
starts (in its thread, or before its coroutine), after the step's own check.

A thread or a task starts on a later turn of the event loop than ``Driver._check_lease``.
A worker stopped in between (SIGSTOP, a long pause while its loop made another commit)
may have been taken over by another worker; then the work must not start at all, not
merely lose its commit (matrix findings M3 for actions, A1 for an agent's tools).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import StaleWrite
from ..store.records import InstanceRecord

if TYPE_CHECKING:
    from .step import Step

__all__ = ["Fence", "lease_fence", "run_fenced"]

#: Called where the work starts: the clock reading (epoch seconds) just before the lease
#: was found current, or ``StaleWrite`` when it was not.
Fence = Callable[[], float]


def _lost(rec: InstanceRecord, what: str) -> StaleWrite:
    return StaleWrite(f"instance {rec.id}: this worker's lease ran out before the "
                      f"{what} started (another worker may own it now)", instance_id=rec.id)


def lease_fence(rec: InstanceRecord, clock: Callable[[], float],
                lease_current: Callable[[str | None], bool], what: str = "action") -> Fence:
    """The fence of one step of ``rec``: ``lease_current(rec.owner)`` (``Ownership.
    lease_current``) must hold when it is called; ``what`` names the work in the
    ``StaleWrite`` message ("action", "tool")."""
    owner = rec.owner

    def check() -> float:
        started = clock()  # read first: the lease was current after this instant
        if not lease_current(owner):
            raise _lost(rec, what)
        return started
    return check


def run_fenced(fn: Callable[..., Any], args: tuple[Any, ...], rec: InstanceRecord,
               owner: str | None, step: Step | None, clock: Callable[[], float],
               lease_current: Callable[[str | None], bool]) -> Any:
    """``fn(*args)`` behind the fence of a step of ``rec`` claimed by ``owner`` (its
    ``rec.owner`` when the step began), called where the action starts (its worker
    thread): ``step.started_at`` (when there is a ``Step``) set to the clock read first,
    then ``StaleWrite`` unless ``lease_current(owner)``: the check ``lease_fence`` makes,
    without a closure per step (and the clock read only for a ``Step``)."""
    if step is not None:
        step.started_at = clock()  # read first: the lease was current after this instant
    if not lease_current(owner):
        raise _lost(rec, "action")
    return fn(*args)
