"""The review queue: list, claim and decide review items, and the SLA timer's decision.

A decision is one transaction: the item's compare-and-set (still open; unclaimed
or claimed by the decider) and the instance's step (compare-and-set on its
version), both or neither (``StepCommit.review_close``).  Every refusal is a
one-line ``ReviewRefused`` raised before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ...errors import ActionError, InvalidInput, ReviewRefused
from ...store.base import Store
from ...store.records import (
    FAILED,
    PAUSED,
    REVIEW_CLOSED,
    REVIEW_OPEN,
    WAITING,
    InstanceRecord,
    ReviewDecision,
    ReviewItem,
    StepCommit,
)
from .. import outcome
from ..compiled import CompiledMachine

#: ``by`` of a decision the SLA timer took.
SLA = "sla-timer"

Advance = Callable[..., StepCommit]


def _refuse(item: ReviewItem, why: str) -> ReviewRefused:
    return ReviewRefused(f"review {item.id}: {why}; nothing was written", item_id=item.id,
                         instance_id=item.instance_id)


def find(store: Store, item_id: str) -> ReviewItem:
    """The item whose id is (or starts with) ``item_id``; ``ReviewRefused`` when none or
    several match."""
    found = store.reviews(id_prefix=item_id) if item_id else []
    exact = [i for i in found if i.id == item_id]
    if exact or len(found) == 1:
        return (exact or found)[0]
    what = "no review item" if not found else f"{len(found)} review items match"
    raise ReviewRefused(f"{what} {item_id!r}", item_id=item_id)


def not_open(item: ReviewItem) -> str:
    """Why ``item``, no longer open, cannot be decided: decided (by whom, what) or closed
    undecided (by whom, why: ``StepCommit.close_reviews``)."""
    if item.status == REVIEW_CLOSED:
        return f"closed undecided by {item.decided_by}: {item.note}"
    return f"already decided: {item.choice} by {item.decided_by}"


def stale(item: ReviewItem, rec: InstanceRecord) -> str | None:
    """Why ``item`` does not apply to ``rec`` now (paused: not yet; moved on: no longer),
    else None."""
    here = rec.state == item.state and rec.visits.get(item.state, 1) == item.visit
    if here and rec.status == WAITING:
        return None
    if here and rec.status == PAUSED:
        return (f"instance {rec.id} is paused ({rec.reason}): unpause it first "
                f"(`fsm unpause {rec.id}`), then decide")
    return f"stale: instance {rec.id} moved on (now {rec.status} in state {rec.state!r})"


def _checked_edit(cm: CompiledMachine, item: ReviewItem, rec: InstanceRecord,
                  update: Mapping[str, Any]) -> dict[str, Any]:
    not_editable = sorted(set(update) - set(item.editable))
    if not_editable:
        allowed = ", ".join(item.editable) or "none"
        raise _refuse(item, f"field(s) {', '.join(not_editable)} are not editable "
                            f"(editable: {allowed})")
    review = cm.states[item.state].review
    model = review.editable if review is not None else None
    if model is not None and update:
        try:
            model.model_validate({**{f: rec.context.get(f) for f in item.editable}, **update})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "(root)"
            raise _refuse(item, f"edit rejected by {model.__name__}: {first['msg']} at "
                                f"{where}") from None
    return dict(update)


def decision(cm: CompiledMachine, rec: InstanceRecord, item: ReviewItem, choice: str, *,
             by: str, now: float, advance: Advance, update: Mapping[str, Any] | None = None,
             note: str | None = None, claimer: str | None = None) -> StepCommit:
    """The commit taking ``choice`` on ``item`` (with the edit ``update``); refusals raise
    ``ReviewRefused``.  After a loop cap routed here, the decision grants another
    ``max_transitions`` transitions."""
    if item.status != REVIEW_OPEN:
        raise _refuse(item, not_open(item))
    why = stale(item, rec)
    if why:
        raise _refuse(item, why)
    if claimer is not None and item.claimed_by not in (None, claimer):
        raise _refuse(item, f"claimed by {item.claimed_by}")
    if choice not in item.choices:
        raise _refuse(item, f"choice {choice!r} is not offered ({', '.join(item.choices)})")
    edit = _checked_edit(cm, item, rec, update or {})
    if cm.states[item.state].agent is not None:  # a tool call's approval
        from .agent_review import decision as call_decision
        return call_decision(cm, rec, item, choice, by=by, now=now, advance=advance,
                             edit=edit, note=note, claimer=claimer)
    base = rec
    if rec.loop_count >= rec.max_transitions:
        base = outcome.clone(rec)
        base.max_transitions = rec.loop_count + cm.spec.max_transitions
    try:
        commit = advance(cm, base, cm.states[item.state], None, choice, edit, 0.0, kind="review")
    except (InvalidInput, ActionError) as exc:
        raise _refuse(item, str(exc)) from None
    if commit.record.status == FAILED and commit.record.reason == "no_transition":
        raise _refuse(item, f"no transition on {choice!r} passed its guards")
    commit.before = rec
    if commit.record.status != FAILED:  # the routed failure's reason is settled
        commit.record.reason = None
    row = commit.history[0]
    row.detail["review"] = {"item": item.id, "by": by, "note": note, "edit": edit}
    commit.review_close = ReviewDecision(item.id, by, now, choice, note, edit or None, claimer)
    return commit


def timed_out(cm: CompiledMachine, rec: InstanceRecord, store: Store, now: float,
              advance: Advance) -> StepCommit:
    """The SLA timer's commit for ``rec`` waiting in a review state: ``on_timeout`` taken
    (by ``SLA``), or the instance failed with reason ``review_timeout`` when that is
    refused (e.g. its guards fail)."""
    review = cm.states[rec.state].review
    assert review is not None and review.on_timeout is not None
    item_id = outcome.review_id(rec.id, rec.state, rec.visits.get(rec.state, 1))
    items = store.reviews(id_prefix=item_id)
    try:
        if not items:
            raise ReviewRefused(f"review item {item_id} is missing", item_id=item_id)
        return decision(cm, rec, items[0], review.on_timeout, by=SLA, now=now, advance=advance,
                        note=f"no decision within {review.sla_s:g} s")
    except ReviewRefused as exc:
        return outcome.failed(cm, rec, "review_timeout", now, error=str(exc))


def timer_due(rec: InstanceRecord, now: float) -> bool:
    """True when ``rec`` waits with a timer (a review's SLA) that is due."""
    return rec.status == WAITING and rec.next_attempt_at is not None and rec.next_attempt_at <= now


def sla_due(cm: CompiledMachine, store: Store, rec: InstanceRecord) -> float | None:
    """When the SLA timer of ``rec``'s open review item falls due (epoch seconds; ``None``:
    no SLA that decides, or no item)."""
    review = cm.states[rec.state].review
    if review is None or review.sla_s is None or review.on_timeout is None:
        return None
    items = store.reviews(id_prefix=outcome.review_id(rec.id, rec.state,
                                                      rec.visits.get(rec.state, 1)))
    return items[0].due_at if items else None
