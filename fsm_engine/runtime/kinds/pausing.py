"""Pause requests: pausing an instance a live worker is stepping (pure parts).

An instance between steps is paused at once (``outcome.paused``, one ledger commit).
One held by a live worker may be in the middle of a step, whose commit must land: the
client then *touches* the instance: one commit that writes the request into its
``pause_request`` column (``PauseRequest``, JSON) and bumps its version, so the worker's
step commit no longer matches.  The request and its touch are one write: no request
exists without its touch, none outlives the commit that pauses or ends the instance (the
ledger drops it there, ``Ledger.settle``).  The ledger, finding a step stale, writes it
anyway with the pause appended (``rebase``) when the stored instance carries a request
whose touches are the only writes since the version the step expected
(``PauseRequest.base``) and the last of them is what is stored (``PauseRequest.version``):
the step's commit lands, the next step never starts.  Any other interfering write (a
cancel, a takeover) leaves the step stale, as before.  An instance whose holder gave it
back or died before its next commit still carries the request: whoever claims it next
pauses it at once (``on_claim``), before any step.  Asking again after an unpause withdrew
the request, or withdrawing it, is one more touch (``touch``).
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from pydantic.dataclasses import dataclass

from ...definition.spec import Machine, State
from ...errors import BudgetExhausted
from ...store.records import PAUSED, InstanceRecord, StepCommit
from .. import outcome

#: Longest operator name or reason kept (characters).
MAX_TEXT = 200

#: Operator text as kept: a string, cut to ``MAX_TEXT`` characters.
_Text = Annotated[StrictStr, AfterValidator(lambda s: s[:MAX_TEXT])]


@dataclass(frozen=True, slots=True, config=ConfigDict(extra="ignore", allow_inf_nan=False))
class PauseRequest:
    """Who asked for a pause (``by``), why, when (epoch s); ``base``: the instance version
    before the request's first touch (what the holder's running step expects);
    ``version``: the version its latest touch wrote.  Also the stored JSON's shape
    (``encode``, ``decode``): strict types (a number is no text, a bool no number, a time
    is finite), the texts cut to ``MAX_TEXT``, ``withdrawn`` only when it is ``true``,
    other keys ignored."""

    by: _Text | None
    reason: _Text
    at: StrictFloat
    base: StrictInt
    version: StrictInt
    #: Unpaused before it applied: the next commit or claim only drops it.
    withdrawn: Annotated[bool, BeforeValidator(lambda v: v is True)] = False


_STORED: TypeAdapter[PauseRequest] = TypeAdapter(PauseRequest)


def with_parent(parent_id: str) -> str:
    """The pause reason of a child paused with its parent ``parent_id`` (``Client.pause``;
    ``Client.unpause`` ends exactly those pauses)."""
    return f"paused with its parent {parent_id}"[:MAX_TEXT]


def encode(req: PauseRequest) -> str:
    """The stored JSON of ``req`` (an object of its fields; ``ValueError`` for a time that
    is not finite)."""
    return json.dumps(_STORED.dump_python(req), allow_nan=False)


def decode(text: str | None) -> PauseRequest | None:
    """The request stored as ``text`` (``InstanceRecord.pause_request``); ``None`` when
    there is none or it is not one (a stored value is hostile: one not fitting
    ``PauseRequest`` is ignored, never trusted)."""
    if not text:
        return None
    try:
        return _STORED.validate_json(text)
    except ValidationError:
        return None


def touch(rec: InstanceRecord, req: PauseRequest | None, now: float, *, by: str | None,
          reason: str, withdrawn: bool = False) -> StepCommit:
    """The commit asking ``rec``'s holder to pause it (``withdrawn``: no longer), ``req``
    the request it carries already (None: the first touch)."""
    base = rec.version if req is None else req.base
    new = PauseRequest(by, reason, now, base, rec.version + 1, withdrawn)
    after = outcome.clone(rec)
    after.updated_at, after.pause_request = now, encode(new)
    return StepCommit(after, rec.version, before=rec)


def applies(stored: InstanceRecord, step: StepCommit) -> bool:
    """True when ``step`` went stale only because of the touches of the request ``stored``
    carries (and is no touch itself: two operators asking at once make one request, not a
    pause mid-step)."""
    req = decode(stored.pause_request)
    return (req is not None and step.record.pause_request is None
            and req.base == step.expected_version and req.version == stored.version)


def rebase(step: StepCommit, stored: InstanceRecord, now: float) -> StepCommit:
    """``step`` (in place) to be written over the touches: expected at ``stored``'s
    version, the request dropped and, unless it was withdrawn or the step ends or already
    pauses the instance, paused after it (its pause row appended)."""
    req = decode(stored.pause_request)
    step.expected_version = stored.version
    step.before = None  # every column written: the touch's request must not survive
    rec = step.record
    rec.pause_request = None
    if req is not None and not req.withdrawn and not rec.final and rec.status != PAUSED:
        step.history = [*step.history, outcome.pause_in_place(rec, now, by=req.by,
                                                              reason=req.reason)]
    return step


def on_claim(rec: InstanceRecord, now: float) -> StepCommit:
    """The commit a claimer makes of ``rec`` found carrying a request: paused as it asked,
    or, the request withdrawn (or unreadable), the request just dropped."""
    req = decode(rec.pause_request)
    if req is None or req.withdrawn:
        return dropped(rec)
    return outcome.paused(rec, now, by=req.by, reason=req.reason)


def dropped(rec: InstanceRecord) -> StepCommit:
    """The commit dropping ``rec``'s request, nothing else (a withdrawn one, or one
    withdrawn while nobody held the instance)."""
    after = outcome.clone(rec)
    after.pause_request = None
    return StepCommit(after, rec.version, before=rec)


def by_policy(machine: Machine, state: State, exc: BaseException, retryable: bool,
              reason: str) -> bool:
    """True when a failure for good pauses the instance instead of failing it: its retries
    ran out (``retryable``; not an open breaker, which has ``on_circuit_open``) or a token
    budget did, and the state's ``on_exhausted`` (else the machine's
    ``on_retries_exhausted``) is ``"pause"``."""
    if (state.on_exhausted or machine.on_retries_exhausted) != "pause":
        return False
    return isinstance(exc, BudgetExhausted) or (retryable and reason != "circuit_open")
