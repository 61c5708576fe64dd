"""The parts of a history row's ``detail`` that are read back (issue 37): their shapes,
beside ``HistoryRow``, for the runtime that writes them and the readers that show or
resume from them.

A stored detail is hostile (another tool, a hand edit, an older or newer fsm_engine):
every shape here reads field by field (``Lenient``): a field of the wrong type reads as
absent, never raises and never costs the row's other fields, as the hand checks it
replaces did; a detail that is not an object reads as one with no fields.  Numbers are
strict: a bool is no number, text is no number, and a number past a float's range (an
integer of 400 digits) is none.

- ``StepDetail``: the counters of a step's row a rebuild reads (``reasks``, ``attempt``:
  ``runtime.step.history_detail``; ``runtime.kinds.replay``);
- ``PauseDetail``: a ``kind: pause`` row (``runtime.outcome.pause_in_place``);
- ``UnpauseDetail``: a ``kind: unpause`` row (``runtime.outcome.unpaused``);
- ``CancelDetail``: a ``kind: cancel`` row (``runtime.outcome.cancelled``);
- ``due_times``: the due times a row recorded of its state's timers (``detail.timers``,
  ``runtime.kinds.timers``);
- ``fired_timer``: when a timer fire row's timer was due and how late it fired
  (``detail.timer``, ``runtime.kinds.timers.fire``);
- ``AgentDetail``: the calls of an agent journal turn its one-line note reads
  (``runtime.kinds.agent_journal``);
- ``ReviewDetail``: who decided a review row or an agent's approval (``review``:
  ``runtime.kinds.reviews``, ``agent_review``);
- ``join_counts``: how a fan-out's branches ended (``detail.branches`` of a join row,
  ``runtime.kinds.fanout``);
- ``structured_outputs``: what a step's structured output saw (``detail.structured``,
  ``runtime.step``), as the viewer shows it;
- ``LlmCall``: a step's model call (``llm_calls``: ``runtime.calls.meter`` and
  ``bill``), as a recorded reply (``runtime.reply_cache``) and an inline stream
  (``runtime.stream_inline``) read it back.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar, cast

from pydantic import (
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    with_config,
)
from typing_extensions import TypedDict  # (pydantic reads typing.TypedDict from 3.12 on)

T = TypeVar("T")


def _or_none(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


#: A field read as ``T`` or, when what is stored is not one, as absent (``None``).
Lenient = Annotated[T | None, WrapValidator(_or_none)]
#: Seconds or epoch seconds: an int within a float's range, or a float.
Number = Lenient[StrictFloat]
Text = Lenient[StrictStr]
#: A count: an int >= 0 within an SQL ``BIGINT``.
Count = Lenient[Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]]


@with_config(ConfigDict(extra="ignore"))
class StepDetail(TypedDict, total=False):
    """A step's counters: the re-asks its structured output took (``reasks``) and which
    attempt it was (``attempt``, 1-based)."""

    reasks: Count
    attempt: Count


@with_config(ConfigDict(extra="ignore"))
class PauseDetail(TypedDict, total=False):
    """A pause row: who (``operator``; ``None``: a policy), the ``status`` and ``reason``
    unpausing restores, the seconds its timer (``timer_left_s``) and deadline
    (``deadline_left_s``) had left, and a delayed start's due time (``scheduled_due``,
    epoch s)."""

    operator: Text
    status: Text
    reason: Text
    timer_left_s: Number
    deadline_left_s: Number
    scheduled_due: Number


@with_config(ConfigDict(extra="ignore"))
class UnpauseDetail(TypedDict, total=False):
    """An unpause row: who (``operator``), after how long paused (``paused_s``)."""

    operator: Text
    paused_s: Number


@with_config(ConfigDict(extra="ignore"))
class CancelDetail(TypedDict, total=False):
    """A cancel row: who (``operator``), and a delayed start's due time it keeps for a
    restart (``scheduled_due``, epoch s)."""

    operator: Text
    scheduled_due: Number


@with_config(ConfigDict(extra="ignore"))
class AgentDetail(TypedDict, total=False):
    """What an agent journal turn's note reads: its ``calls`` (the objects among them)."""

    calls: Lenient[list[Lenient[dict[str, Any]]]]


@with_config(ConfigDict(extra="ignore"))
class ReviewDetail(TypedDict, total=False):
    """A decision's ``review``: ``item``, ``by`` (the decider, ``runtime.kinds.reviews.SLA``
    for its timer), ``note``, ``edit``; each as it is."""

    review: Lenient[dict[str, Any]]


@with_config(ConfigDict(extra="ignore"))
class _Join(TypedDict, total=False):
    branches: Lenient[dict[str, Count]]


@with_config(ConfigDict(extra="ignore"))
class LlmCall(TypedDict, total=False):
    """One model call of a step: its reply cache ``key`` and ``reply`` (text), the
    ``model`` (``provider:model``), ``finish_reason``, its ``error`` (``None``: none: shown
    as it is) and, for a short streamed call, the ``stream`` mark (``{"json": bool}``)."""

    key: Text
    reply: Text
    model: Text
    finish_reason: Text
    error: Any
    stream: Lenient[dict[str, Any]]


@with_config(ConfigDict(extra="ignore"))
class _Calls(TypedDict, total=False):
    llm_calls: Lenient[list[Lenient[LlmCall]]]


@with_config(ConfigDict(extra="ignore"))
class _Structured(TypedDict, total=False):
    structured: Lenient[list[Lenient[dict[str, Any]]]]


@with_config(ConfigDict(extra="ignore"))
class _Timers(TypedDict, total=False):
    timers: Lenient[dict[str, Number]]


@with_config(ConfigDict(extra="ignore"))
class FiredTimer(TypedDict, total=False):
    """A timer fire's ``detail.timer`` (``runtime.kinds.timers.fire``): when it was ``due``
    (epoch s) and how late it fired (``lateness_s``, seconds)."""

    due: Number
    lateness_s: Number


@with_config(ConfigDict(extra="ignore"))
class _Fired(TypedDict, total=False):
    timer: Lenient[FiredTimer]


_ADAPTERS: dict[type, TypeAdapter[Any]] = {
    StepDetail: TypeAdapter(Lenient[StepDetail]),
    PauseDetail: TypeAdapter(Lenient[PauseDetail]),
    UnpauseDetail: TypeAdapter(Lenient[UnpauseDetail]),
    CancelDetail: TypeAdapter(Lenient[CancelDetail]),
    AgentDetail: TypeAdapter(Lenient[AgentDetail]),
    ReviewDetail: TypeAdapter(Lenient[ReviewDetail]),
    _Join: TypeAdapter(Lenient[_Join]),
    _Calls: TypeAdapter(Lenient[_Calls]),
    _Structured: TypeAdapter(Lenient[_Structured]),
    _Timers: TypeAdapter(Lenient[_Timers]),
    _Fired: TypeAdapter(Lenient[_Fired])}


def read(shape: type[T], detail: Any) -> T:
    """``detail`` (a stored row's, as it is) read as ``shape``, one of this module's: the
    fields that fit, a field that does not left out; ``{}`` when ``detail`` is no object."""
    got = _ADAPTERS[shape].validate_python(detail) or {}
    return cast(T, {k: v for k, v in got.items() if v is not None})


def due_times(detail: Any) -> dict[str, float]:
    """The due times (trigger -> epoch s) a row's ``detail.timers`` recorded: the entries
    that are numbers (``{}``: none, or no object)."""
    times = read(_Timers, detail).get("timers") or {}
    return {t: due for t, due in times.items() if due is not None}


def fired_timer(detail: Any) -> FiredTimer:
    """A timer fire row's ``detail.timer``, the fields that fit (``{}``: none)."""
    timer = read(_Fired, detail).get("timer") or {}
    return cast(FiredTimer, {k: v for k, v in timer.items() if v is not None})


def llm_calls(detail: Any) -> list[LlmCall]:
    """A row's ``detail.llm_calls``: the entries that are objects, in call order, each with
    the fields that fit (``[]``: none, or no list)."""
    calls = read(_Calls, detail).get("llm_calls") or []
    return [cast(LlmCall, {k: v for k, v in c.items() if v is not None})
            for c in calls if c is not None]


def structured_outputs(detail: Any) -> list[dict[str, Any]]:
    """A row's ``detail.structured``: each structured output's ``raw`` text, ``errors`` and
    ``repairs`` as it is, the entries that are objects (``[]``: none, or no list)."""
    return [o for o in read(_Structured, detail).get("structured") or () if o is not None]


_OBJECT: TypeAdapter[dict[str, Any] | None] = TypeAdapter(Lenient[dict[str, Any]])


def as_object(detail: Any) -> dict[str, Any]:
    """``detail`` as it is when it is an object, else ``{}`` (a copy: its values shared)."""
    return _OBJECT.validate_python(detail) or {}


def join_counts(detail: Any) -> dict[str, int]:
    """A join row's ``detail.branches``: branches by how they ended (``succeeded``,
    ``failed``, ``skipped``, ``running``: cancelled), the counts that are ints >= 0."""
    counts = read(_Join, detail).get("branches") or {}
    return {k: n for k, n in counts.items() if n is not None}


def reviewer(detail: Any) -> Any:
    """Who decided the review ``detail`` records (``review.by``, as it is; ``None``: none)."""
    return (read(ReviewDetail, detail).get("review") or {}).get("by")
