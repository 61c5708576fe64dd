"""One step of one instance: run the action under its policies, decide, record.

``Driver.step_once`` is the heart of the runtime.  It never advances an
instance without committing first: the new state, context, counters and the
history row go to the store in one transaction (shared with other instances'
steps by the group committer), and only then does the in-memory record move.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from ..definition.spec import BUDGET_EXHAUSTED, FALLBACK, State
from ..errors import (
    ActionError,
    BudgetExhausted,
    CircuitOpen,
    InvalidInput,
    StaleWrite,
    StepRejected,
    StepTimeout,
    StructuredOutputError,
)
from ..policies import Disposition, classify, retry_after
from ..store.base import Store
from ..store.records import InstanceRecord, OutboxBegin, OutboxRow, StepCommit
from . import invoke, outcome, stream_inline, streams, values
from .calls import CallSettings, Limit
from .commit import Coalesced, GroupCommitter
from .compiled import CompiledMachine, GuardResultError
from .kinds import base as kinds
from .kinds import (
    builtin,  # noqa: F401 - registers the built-in kinds of step
    fanout,
    fork,
    migration,
    pausing,
)
from .kinds.replay import visit_tokens
from .model_registry import Models
from .reply_cache import RecordedReplies, ReplyCache
from .step import MeteredLLM, Step, history_detail, run_info
from .threads import ActionThreads
from .values import apply_update  # noqa: F401 - the context boundary; fanout imports it here

_REASONS = {StepTimeout: "timeout", CircuitOpen: "circuit_open", BudgetExhausted: "token_budget",
            StructuredOutputError: "invalid_output", InvalidInput: "invalid_update"}


def _reason(exc: BaseException, retryable: bool) -> str:
    for cls, reason in _REASONS.items():
        if isinstance(exc, cls):
            return reason
    return "retries_exhausted" if retryable else "error"


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _spent(step: Step | None) -> int:
    """Tokens the step's model calls were billed (0 when the action had no ``Step``)."""
    return 0 if step is None else step.llm.used


def _lease_lost(rec: InstanceRecord) -> StaleWrite:
    return StaleWrite(f"instance {rec.id}: this worker's lease ran out before the step "
                      "began (another worker may own it now)", instance_id=rec.id)


class Driver:
    """Runs single steps; owned by an ``Engine``."""

    def __init__(self, store: Store, committer: GroupCommitter, *, models: Models,
                 clock: Callable[[], float], rng: random.Random,
                 threads: ActionThreads) -> None:
        self.store = store
        self.committer = committer
        self.models = models
        self.clock = clock
        self.rng = rng
        self.threads = threads
        #: Side effects starting in one loop iteration record their outbox rows together.
        self.begins: Coalesced[OutboxBegin, OutboxRow] = Coalesced(
            lambda items: store.outbox_begins(items))
        #: Upcasts of instances loaded to step (id -> ``migration.Upcast``), written with
        #: their next commit (``attach``).
        self.upcasts = migration.Pending()
        #: The worker that will run the children a step of an instance creates (``None``:
        #: created unowned, for any worker to claim); the engine sets it for the families
        #: its ``run`` continues.
        self.host: Callable[[InstanceRecord], str | None] = lambda rec: None
        self.streams = streams.Streams(store)  # where streamed calls write (``.retention_s``)
        #: Whether this worker's lease is still current (``Ownership.lease_current``): no
        #: action or delivery starts under a lease that ran out.
        self.lease_current: Callable[[str | None], bool] = lambda owner: True
        #: Told the children a committed step created (so they run without a read).
        self.born: Callable[[Sequence[InstanceRecord]], None] = lambda records: None
        self._kind_state: dict[str, dict[str, Any]] = {}  # see ``kind_state``

    def attach(self, step: StepCommit) -> StepCommit:
        """``step`` carrying its instance's pending upcast, if it continues from it."""
        return self.upcasts.attach(step)

    #: ``hand_off(before, after)``: True when a step moving an instance into another queue
    #: must give it back in the same commit (owner cleared: claimed again under that
    #: queue's limits); set by a worker (``runtime.worker``), None: never.
    hand_off: Callable[[InstanceRecord, InstanceRecord], bool] | None = None

    async def commit(self, rec: InstanceRecord, step: StepCommit) -> InstanceRecord:
        """Commit ``step`` (with the instance's pending upcast); return the new record, or
        raise ``StaleWrite`` when we lost the race."""
        new = step.record
        if self.hand_off is not None and new.queue != rec.queue and new.owner is not None \
                and not new.final and self.hand_off(rec, new):
            new.owner = None
        if self.upcasts:
            self.attach(step)
        if new.final:  # a family's effects (``Ledger.settle``) start from an end
            self.committer.ledger.settle(step)
        if rec.id in self.streams.batcher.held:  # its streamed calls' rows still waiting
            got = self.streams.tail(rec.id, step)
            step.stream = got if isinstance(got, tuple) else await got
        done = self.committer.enqueue(step)
        if isinstance(done, asyncio.Future):
            done = await done
        if not done:
            raise StaleWrite(f"instance {rec.id} changed under this worker (cancelled, or its "
                             "lease was taken over)", instance_id=rec.id, state=rec.state)
        if self.upcasts:
            self.upcasts.settled(step)
        if step.create:
            self.born(step.create)
        return step.record

    async def _record(self, cm: CompiledMachine, rec: InstanceRecord,
                      step: StepCommit) -> InstanceRecord:
        """``commit``, failing the step alone (``store_rejected``) when the store refuses
        its values."""
        try:
            return await self.commit(rec, step)
        except StepRejected as exc:  # the step's values, not the store: fail it alone
            return await self._rejected(cm, rec, step, exc)

    async def _rejected(self, cm: CompiledMachine, rec: InstanceRecord, step: StepCommit,
                        exc: StepRejected) -> InstanceRecord:
        """Commit the failure (``store_rejected``) of a step whose values the store refused,
        with the streamed rows the step carried (its calls' replies stay in the log); a
        store that refuses those too gets the failure alone."""
        spent = max(0, step.record.tokens_used - rec.tokens_used)
        failure = outcome.failed(cm, rec, "store_rejected", self.clock(), error=str(exc),
                                 tokens=spent)
        stream = step.stream or stream_inline.ops(step)  # (its calls' rows, if inline)
        if stream:
            failure.stream = stream
            try:
                return await self.commit(rec, failure)
            except StepRejected:
                failure.stream = ()
        return await self.commit(rec, failure)

    #: An OpenTelemetry tracer (``fsm_engine.telemetry``), or None: no spans, no cost.
    tracer: Any = None

    async def step_once(self, cm: CompiledMachine, rec: InstanceRecord) -> InstanceRecord:
        """Run one step of ``rec`` in its state's kind (``kinds.base``) and record it."""
        kind = (cm.kinds or kinds.table(cm))[rec.state]
        if kind.owns_commit:  # no action to trace: e.g. a fan-out's start, wait or join
            return await kind.commit(self, cm, rec)
        if self.tracer is not None:
            from ..telemetry import traced_step
            return await traced_step(self.tracer, self.decide,
                                     lambda rec, step: self._record(cm, rec, step), cm, rec)
        state, now = cm.states[rec.state], self.clock()  # ``decide`` and ``_record``, inline:
        step = self._forced(cm, rec, state, now, kind)  # two coroutines less per step
        if step is None:
            step = await self._attempt(cm, rec, state, now, kind)
        try:
            return await self.commit(rec, step)
        except StepRejected as exc:
            return await self._rejected(cm, rec, step, exc)

    async def submit(self, step: StepCommit) -> bool:
        """Commit ``step`` through the group committer's fenced submit (a family's effects
        settled, the pending upcast attached, children born told); False when stale (a
        version it is fenced on moved): the caller reads again (``kinds.base.DriverAPI``)."""
        self.committer.ledger.settle(self.attach(step))
        if not await self.committer.submit(step):
            return False
        self.upcasts.settled(step)
        if step.create:
            self.born(step.create)
        return True

    async def decide(self, cm: CompiledMachine, rec: InstanceRecord) -> StepCommit:
        """The commit recording this step of ``rec`` (its kind's plan, the deadline, the loop
        cap, or what ran), not committed."""
        state, now = cm.states[rec.state], self.clock()
        kind = (cm.kinds or kinds.table(cm))[rec.state]
        step = self._forced(cm, rec, state, now, kind)
        return step if step is not None else await self._attempt(cm, rec, state, now, kind)

    def kind_state(self, name: str) -> dict[str, Any]:
        """A dict this driver keeps for the kind of step ``name`` (its caches; the agent
        kind's journals), created empty at first use."""
        kept = self._kind_state.get(name)
        if kept is None:
            kept = self._kind_state[name] = {}
        return kept

    def _forced(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                now: float, kind: kinds.StepKind) -> StepCommit | None:
        """The commit of a step that runs nothing (its kind's plan: a review, a wait, a
        fan-out; the deadline, the loop cap), or ``None``: run it (``_attempt``)."""
        if not kind.bounded:
            return kind.plan(self, cm, rec, state, now)
        if rec.deadline is not None and now >= rec.deadline:
            return outcome.failed(cm, rec, "deadline", now, error="instance deadline passed")
        if rec.loop_count >= rec.max_transitions:
            return outcome.loop_limited(cm, rec, now)
        return kind.plan(self, cm, rec, state, now) if kind.plans else None

    def make_step(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                  spent: int = 0, *, long_visit: bool = False) -> Step:
        """The ``Step`` an action (or a kind's model call) of ``rec`` in ``state`` gets, its
        model calls under the state's policies.  ``spent``: this visit's tokens in earlier
        commits; ``long_visit``: the visit goes on over many commits (an agent's turns),
        so its failed attempts count whatever ``rec.attempt`` is."""
        visit = rec.visits.get(state.name, 1)
        provider = self.models.for_state(state)
        in_visit = self._visit_tokens(rec, state, visit, long_visit) + spent
        meter = MeteredLLM(provider, self._call_settings(rec, state, provider, in_visit),
                           loop=asyncio.get_running_loop())
        return Step(instance_id=rec.id, state=state.name, attempt=rec.attempt, visit=visit,
                    idempotency_key=fork.outbox_key(rec, state.name, visit), llm=meter,
                    loop_count=rec.loop_count, max_transitions=rec.max_transitions,
                    tokens_used=rec.tokens_used, token_budget=rec.token_budget,
                    triggers=cm.choosable(state.name), state_tokens_used=in_visit,
                    state_token_budget=state.token_budget)

    def _call_settings(self, rec: InstanceRecord, state: State, provider: Any,
                       in_visit: int) -> CallSettings:
        """What governs this step's model calls (``runtime.calls``): budgets, breaker,
        repair model, rate limits, reply cache, a fork's recorded replies, tracing."""
        repair = None if state.repair_llm is None else self.models.by_name.get(state.repair_llm)
        tracer, parent = self.tracer, None
        if tracer is not None:  # model calls become children of this step's span
            from ..telemetry import current_context
            parent = current_context()
        return CallSettings(
            limits=self._limits(rec, state, in_visit), breaker=self.models.breaker(provider),
            repair=None if repair is None or repair is provider
            else (repair, self.models.breaker(repair)),
            loops_left=rec.max_transitions - rec.loop_count, caller_input=rec.input,
            rates=partial(self.models.limiter, alias=state.llm) if self.models.rate_limits else None,
            cache=None if state.cache is None else ReplyCache(self.store, state.cache.ttl_s, self.clock),
            recorded=RecordedReplies(self.store, rec.forked_from)
            if rec.forked_from is not None and rec.fork_options.get("reuse_llm")
            and not state.side_effect else None,
            tracer=tracer, trace_parent=parent, stream_to=self.streams.target(rec))

    def _limits(self, rec: InstanceRecord, state: State, in_visit: int) -> tuple[Limit, ...]:
        """The token budgets a step of ``rec`` in ``state`` runs under (instance: the family's
        shared one when smaller; state: per visit, ``in_visit`` spent by earlier attempts)."""
        out: list[Limit] = []
        if rec.token_budget is not None:
            # unclamped (may be < 0 after an overshoot) so BudgetExhausted reports the real spend
            left = rec.token_budget - rec.tokens_used
            if rec.parent_id is not None:  # the family shares one budget
                family = fanout.family_left(self.store, rec)
                left = left if family is None else min(left, family)
            out.append(Limit("instance", left, rec.token_budget))
        if state.token_budget is not None:
            out.append(Limit("state", state.token_budget - in_visit, state.token_budget))
        return tuple(out)

    def _visit_tokens(self, rec: InstanceRecord, state: State, visit: int,
                      long_visit: bool) -> int:
        """Tokens this visit of ``state`` spent in earlier (failed) attempts; read from the
        store only after a first attempt (``replay.visit_tokens``), or in a ``long_visit``
        (an agent's: each journaled turn starts again at attempt 1, and a turn that failed
        before it still counts)."""
        if rec.attempt <= 1 and not long_visit:
            return 0
        return visit_tokens(self.store.attempts(rec.id), state.name, visit)

    async def _attempt(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                       now: float, kind: kinds.StepKind) -> StepCommit:
        """Run the step's kind (after the retry's backoff, when one is due later than
        ``now``); return the commit recording what happened."""
        if rec.next_attempt_at is not None and rec.next_attempt_at > now:
            await asyncio.sleep(rec.next_attempt_at - now)
        if not self.lease_current(rec.owner):  # (``check_lease``, inline: the hot path)
            raise _lease_lost(rec)
        if kind.runs:  # e.g. an agent's tool-calling loop: one turn or call per step
            return await kind.run(self, cm, rec, state, now)
        return await self.run_action(cm, rec, state, now)

    async def run_action(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                         now: float) -> StepCommit:
        """Run ``state``'s action (if any) once under its policies: the plain kind's ``run``;
        the commit recording what happened.  Raises ``StaleWrite`` when the lease was lost
        before the action started."""
        entry = cm.actions.get(state.name)
        # the ``Step`` the action gets: only actions that take ``step`` (and side effects,
        # for their key) need one
        step = self.make_step(cm, rec, state) if state.side_effect or (
            entry is not None and entry[1] == 2) else None
        if step is not None and state.side_effect:
            replayed = await self._begin_delivery(cm, rec, state, step)
            if replayed is not None:
                return replayed
        started = time.perf_counter()
        error: BaseException | None = None
        result: Any = None
        ran_on: values.Watched | None = None
        try:
            if entry is not None:
                ran_on = values.Watched(cm.spec.context, rec.context)
                pending, result = invoke.start(  # on ``ran_on.ctx``
                    entry, ran_on.ctx, rec, state, step, threads=self.threads,
                    clock=self.clock, lease_current=self.lease_current)
                if pending is not None:
                    result = await pending
        except StaleWrite:
            raise  # the lease was lost before the action started (``_fenced``)
        except (TimeoutError, Exception) as exc:
            error = exc
        ms = (time.perf_counter() - started) * 1000.0
        return self._recorded(cm, rec, state, step, result, error, ran_on, ms)

    def check_lease(self, rec: InstanceRecord) -> None:
        """``StaleWrite`` when this worker's lease on ``rec`` ran out (``lease_current``)."""
        if not self.lease_current(rec.owner):
            raise _lease_lost(rec)

    async def _begin_delivery(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                              step: Step) -> StepCommit | None:
        """Before a side effect runs: the fork's original outcome when the original already
        delivered it (nothing runs), else None once its outbox row counts this attempt."""
        replayed = self._delivered_by_original(cm, rec, state, step)
        if replayed is not None:
            return replayed
        row = await self.begins(OutboxBegin(step.idempotency_key, rec.id, state.name,
                                            step.visit, self.clock()))
        step.outbox_attempt = row.attempts
        return None

    def _recorded(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                 step: Step | None, result: Any, error: BaseException | None,
                 ran_on: values.Watched | None, ms: float) -> StepCommit:
        """The commit for an action that returned ``result`` or raised ``error``: a rate
        limit's wait, the advance, or the error's retry / fallback / failure."""
        if step is not None and step.llm.rate_wait is not None:  # waits, whatever the action did
            wait, now = step.llm.rate_wait, self.clock()
            return outcome.rate_limited(rec, error=str(wait), tokens=_spent(step),
                                        next_at=now + wait.retry_in, now=now)
        if error is None and step is not None and step.notes:
            try:
                values.check_json(step.notes, "step.notes")
            except InvalidInput as exc:  # named in the error, kept out of the history row
                error, step.notes = exc, {}
        if error is None:
            try:
                return self.advance(cm, rec, state, step, *invoke.normalise(result), ms,
                                    ran_on=ran_on)
            except (InvalidInput, ActionError) as exc:  # bad update, trigger or guard
                error = exc
        return self.on_error(cm, rec, state, step, error, ms)

    def _delivered_by_original(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                               step: Step) -> StepCommit | None:
        """For a fork at a side effect delivered up its lineage (its original, that one's
        original, ...; the nearest first): that delivery's recorded outcome, taken again
        without running the action (``None``: run it)."""
        found = fork.lineage_delivery(self.store, rec, state.name, step.visit)
        if found is None:
            return None
        done, row = found
        self.store.outbox_begin(step.idempotency_key, rec.id, state.name, step.visit,
                                self.clock())
        step.notes["delivered_by_original"] = done.key
        return self.advance(cm, rec, state, step, row.trigger, row.delta, 0.0)

    def advance(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                step: Step | None, trigger: str | None, update: Mapping[str, Any],
                ms: float, *, kind: str = "transition", reason: str | None = None,
                error: str | None = None, ran_on: values.Watched | None = None) -> StepCommit:
        """The commit taking the transition chosen after ``update`` (and ``trigger``, if fired).

        ``ran_on``: the context the action ran on; what it changed there in place is
        committed with ``update`` (``update`` wins for a field it sets).
        Raises ``InvalidInput`` for a bad update, an in-place change that cannot be stored
        or an undeclared trigger, ``ActionError`` when a guard raises.
        """
        obj, new_ctx, delta = values.apply_update(cm.spec.context, rec.context, update,
                                                  cm.fields, cm.partial)
        if ran_on is not None and (moved := ran_on.changed(update)):
            obj, new_ctx, delta = values.apply_in_place(cm.spec.context, rec.context, update,
                                                        ran_on, moved, cm.fields, cm.partial)
        if trigger and not cm.has_trigger(state.name, trigger):
            raise InvalidInput(f"state {state.name!r} fired undeclared trigger {trigger!r}")
        tokens = _spent(step)
        run = partial(run_info, rec, state, tokens, step.state_tokens_used if step else 0)
        evaluated: list[list[Any]] = []
        try:
            choice = cm.choose(state.name, obj, run, trigger, evaluated)
        except Exception as exc:  # a guard raised: fail this instance, not the whole batch
            why = str(exc) if isinstance(exc, GuardResultError) else f"a guard raised {_err(exc)}"
            raise ActionError(why, instance_id=rec.id, state=state.name,
                              guards=evaluated) from exc
        detail = history_detail(rec, step)
        if choice is None:
            return outcome.failed(
                cm, rec, "no_transition", self.clock(), tokens=tokens, duration_ms=ms, guards=evaluated,
                error=f"no transition from {state.name!r} passed its guards", detail=detail)
        done = (step.idempotency_key, {"visit": step.visit}) if step and state.side_effect else None
        commit = outcome.transition(
            cm, rec, trigger=choice.trigger, dest=choice.dest, now=self.clock(),
            context=new_ctx, delta=delta, kind=kind, guards=choice.guards,
            tokens=tokens, duration_ms=ms, error=error, reason=reason,
            detail=detail, outbox_done=done, extra_loops=step.llm.reasks if step else 0)
        entering = (cm.kinds or kinds.table(cm)).entering
        into = entering.get(commit.record.state) if entering else None
        return commit if into is None else into.enter(self, cm, commit, rec)

    def on_error(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                  step: Step | None, exc: BaseException, ms: float) -> StepCommit:
        """The commit after a failed attempt: retry later, fallback, skip or fail."""
        disposition = classify(exc)
        policy = state.retry
        now = self.clock()
        if disposition is Disposition.RETRY and policy and policy.should_retry(rec.attempt):
            delay = policy.delay(rec.attempt, retry_after=retry_after(exc), rng=self.rng)
            return outcome.retry_later(rec, error=exc, tokens=_spent(step), next_at=now + delay,
                                       now=now)
        reason = _reason(exc, disposition is Disposition.RETRY)
        try:
            if disposition is not Disposition.FAIL:
                trigger = (BUDGET_EXHAUSTED if isinstance(exc, BudgetExhausted)
                           and cm.has_trigger(state.name, BUDGET_EXHAUSTED) else FALLBACK)
                if cm.has_trigger(state.name, trigger):
                    return self.advance(cm, rec, state, step, trigger, {}, ms,
                                        kind="fallback", reason=reason, error=_err(exc))
            if state.skippable and state.default_output is not None:
                return self.advance(cm, rec, state, step, None, state.default_output, ms,
                                    kind="skip", reason=reason, error=_err(exc))
        except (InvalidInput, ActionError) as second:  # a guard or default that fails too
            exc, reason = second, _reason(second, False)
        detail = history_detail(rec, step)
        if isinstance(exc, StructuredOutputError):
            detail.update(raw=exc.raw[:4000], errors=exc.errors, repairs=exc.repairs)
        if pausing.by_policy(cm.spec, state, exc, disposition is Disposition.RETRY, reason):
            return outcome.paused(rec, now, by=None, reason=reason, error=_err(exc),
                                  tokens=_spent(step), duration_ms=ms, detail=detail)
        if reason == "circuit_open" and cm.spec.on_circuit_open is not None:
            return outcome.routed(cm, rec, cm.spec.on_circuit_open, reason, now, error=_err(exc),
                                  tokens=_spent(step), duration_ms=ms, detail=detail)
        fail = outcome.failed(cm, rec, reason, now, error=_err(exc), tokens=_spent(step),
                              duration_ms=ms, detail=detail)
        fail.history[0].guards = exc.guards if isinstance(exc, ActionError) else []
        return fail
