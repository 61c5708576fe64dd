"""Pause requests: pausing an instance a live worker is stepping (pure parts).

An instance between steps is paused at once (``outcome.paused``, one ledger commit).
One held by a live worker may be in the middle of a step, whose commit must land: the
client then stores a request (``fsm_meta`` key ``pause:ID``, ``Store.put_meta``) and
*touches* the instance (its version bumped and its reason set to ``REQUESTED``, the
reason it had kept in the request), so the worker's step commit no longer matches.
The ledger, finding a step stale, looks for a request made by exactly that touch
(``PauseRequest.version == step.expected_version + 1``) and writes the step anyway
with the pause appended (``rebase``): the step's commit lands, the next step never
starts.  Any other interfering write (a cancel, a takeover) leaves the step stale, as
before.  An instance whose holder gave it back or died before its next commit still
carries ``REQUESTED``: whoever claims it next pauses it at once (``on_claim``), before
any step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...definition.spec import Machine, State
from ...errors import BudgetExhausted
from ...store.records import PAUSED, InstanceRecord, StepCommit
from .. import outcome

#: ``fsm_meta`` key prefix of pause requests (``pause:ID``).
PREFIX = "pause:"
#: Longest operator name or reason kept (characters).
MAX_TEXT = 200
#: The reason of an instance asked to pause while a live worker held it.
REQUESTED = "pause_requested"


@dataclass(frozen=True, slots=True)
class PauseRequest:
    """Who asked for a pause (``by``), why, when (epoch s), the instance version the
    request's touch wrote and the reason the instance had before it."""

    by: str | None
    reason: str
    at: float
    version: int
    prior_reason: str | None = None
    #: Unpaused before it applied: the next commit or claim only gives the reason back.
    withdrawn: bool = False


def with_parent(parent_id: str) -> str:
    """The pause reason of a child paused with its parent ``parent_id`` (``Client.pause``;
    ``Client.unpause`` ends exactly those pauses)."""
    return f"paused with its parent {parent_id}"[:MAX_TEXT]


def key(instance_id: str) -> str:
    """The ``fsm_meta`` key of ``instance_id``'s pause request."""
    return PREFIX + instance_id


def encode(req: PauseRequest) -> str:
    """The stored JSON of ``req``."""
    return json.dumps({"by": req.by, "reason": req.reason, "at": req.at,
                       "version": req.version, "prior_reason": req.prior_reason,
                       "withdrawn": req.withdrawn}, allow_nan=False)


def decode(text: str | None) -> PauseRequest | None:
    """The request stored as ``text``; ``None`` when there is none or it is not one
    (a stored value is hostile: wrong types are ignored, never trusted)."""
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    by, reason, at, version, prior = (raw.get(k) for k in ("by", "reason", "at", "version",
                                                           "prior_reason"))
    if not (by is None or isinstance(by, str)) or not isinstance(reason, str) \
            or not isinstance(at, (int, float)) or type(version) is not int:
        return None
    prior = prior[:MAX_TEXT] if isinstance(prior, str) else None
    return PauseRequest(by and by[:MAX_TEXT], reason[:MAX_TEXT], float(at), version, prior,
                        raw.get("withdrawn") is True)


def applies(req: PauseRequest | None, step: StepCommit, stored_version: int) -> bool:
    """True when ``step`` went stale only because of ``req``'s touch (and is no touch
    itself: two operators asking at once make one request, not a pause mid-step)."""
    touch = step.record.reason == REQUESTED and not step.history
    return (req is not None and not touch and req.version == step.expected_version + 1
            and stored_version == req.version)


def rebase(step: StepCommit, req: PauseRequest, stored_version: int, now: float) -> StepCommit:
    """``step`` (in place) to be written over the touch: expected at ``stored_version``,
    and, unless it ends or already pauses the instance, paused after it (its pause row
    appended)."""
    step.expected_version = stored_version
    step.before = None  # every column written: the touch's reason must not survive
    rec = step.record
    if not req.withdrawn and not rec.final and rec.status != PAUSED:
        step.history = [*step.history, outcome.pause_in_place(rec, now, by=req.by,
                                                              reason=req.reason)]
    return step


def on_claim(rec: InstanceRecord, req: PauseRequest | None, now: float) -> StepCommit:
    """The commit a claimer makes of ``rec`` found carrying ``REQUESTED``: paused as
    ``req`` asked (with the reason it had before the request), or, the request withdrawn
    meanwhile (``req`` None or ``withdrawn``), just that reason given back."""
    prior = outcome.clone(rec)
    prior.reason = req.prior_reason if req is not None else None
    if req is None or req.withdrawn:
        return StepCommit(prior, rec.version, before=rec)
    step = outcome.paused(prior, now, by=req.by, reason=req.reason)
    step.before = rec
    return step


def by_policy(machine: Machine, state: State, exc: BaseException, retryable: bool,
              reason: str) -> bool:
    """True when a failure for good pauses the instance instead of failing it: its retries
    ran out (``retryable``; not an open breaker, which has ``on_circuit_open``) or a token
    budget did, and the state's ``on_exhausted`` (else the machine's
    ``on_retries_exhausted``) is ``"pause"``."""
    if (state.on_exhausted or machine.on_retries_exhausted) != "pause":
        return False
    return isinstance(exc, BudgetExhausted) or (retryable and reason != "circuit_open")
