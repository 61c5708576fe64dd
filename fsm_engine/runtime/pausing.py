"""Pause requests: pausing an instance a live worker is stepping (pure parts).

An instance between steps is paused at once (``outcome.paused``, one ledger commit).
One held by a live worker may be in the middle of a step, whose commit must land: the
client then stores a request (``fsm_meta`` key ``pause:ID``, ``Store.put_meta``) and
*touches* the instance (its version bumped, nothing else changed), so the worker's
step commit no longer matches.  The ledger, finding a step stale, looks for a request
made by exactly that touch (``PauseRequest.version == step.expected_version + 1``) and
writes the step anyway with the pause appended (``rebase``): the step's commit lands,
the next step never starts.  Any other interfering write (a cancel, a takeover) leaves
the step stale, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..definition.spec import Machine, State
from ..errors import BudgetExhausted
from ..store.records import PAUSED, StepCommit
from . import outcome

#: ``fsm_meta`` key prefix of pause requests (``pause:ID``).
PREFIX = "pause:"
#: Longest operator name or reason kept (characters).
MAX_TEXT = 200


@dataclass(frozen=True, slots=True)
class PauseRequest:
    """Who asked for a pause (``by``), why, when (epoch s) and the instance version the
    request's touch wrote."""

    by: str | None
    reason: str
    at: float
    version: int


def key(instance_id: str) -> str:
    """The ``fsm_meta`` key of ``instance_id``'s pause request."""
    return PREFIX + instance_id


def encode(req: PauseRequest) -> str:
    """The stored JSON of ``req``."""
    return json.dumps({"by": req.by, "reason": req.reason, "at": req.at,
                       "version": req.version}, allow_nan=False)


def decode(text: str | None) -> PauseRequest | None:
    """The request stored as ``text``; ``None`` when there is none or it is not one
    (a stored value is hostile: wrong types are ignored, never trusted)."""
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    by, reason, at, version = (raw.get(k) for k in ("by", "reason", "at", "version"))
    if not (by is None or isinstance(by, str)) or not isinstance(reason, str) \
            or not isinstance(at, (int, float)) or type(version) is not int:
        return None
    return PauseRequest(by and by[:MAX_TEXT], reason[:MAX_TEXT], float(at), version)


def applies(req: PauseRequest | None, step: StepCommit, stored_version: int) -> bool:
    """True when ``step`` went stale only because of ``req``'s touch."""
    return (req is not None and req.version == step.expected_version + 1
            and stored_version == req.version)


def rebase(step: StepCommit, req: PauseRequest, stored_version: int, now: float) -> StepCommit:
    """``step`` (in place) to be written over the touch: expected at ``stored_version``,
    and, unless it ends or already pauses the instance, paused after it (its pause row
    appended)."""
    step.expected_version = stored_version
    rec = step.record
    if not rec.final and rec.status != PAUSED:
        step.history = [*step.history, outcome.pause_in_place(rec, now, by=req.by,
                                                              reason=req.reason)]
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
