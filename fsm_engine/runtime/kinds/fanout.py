"""Fan-out states at run time: start children, top them up, wait, join (commit builders).

A parent entering a fan-out state gets its first children in the same commit
(``StepCommit.create``), and waits (status ``waiting``, reason ``children``,
no owner).  Children are ordinary instances, claimable by any worker; the
commit that makes one final wakes its parent (``StepCommit.wake``).  The
woken parent counts its children from ``Store.child_states`` (no JSON decoded,
so a wake of a 1,000-child family costs a millisecond, not a decode of every
child's context): undecided, it creates more (``max_concurrency``) and waits
again, its commit fenced on the versions of the children still running (a child
finishing meanwhile makes it stale: the parent reads again); decided, it reads
the final children's outputs (``Store.child_outputs``; the children in full
only when some still run, to cancel them) and joins in one commit fenced on
every child it counted, cancelling the ones still running (``StepCommit.also``),
adding the family's tokens to its own.

Children that the parent's own engine will run (``Engine.run`` continuing the
family) are created owned by that engine's worker, so they need no claim of
their own; otherwise they are created unowned, for any worker to claim.

Children of one fan-out have ids ``{parent id}.{N}.{index}``, ``N`` the parent's
``seq`` in the step that started the family: unique per fan-out, in branch/item
order, and a second start of the same fan-out is a duplicate id, so a family is
never started twice.  The family is found again from the children themselves
(``current``: the latest ``N`` among the parent's children), never from the
parent's ``seq`` now — a takeover or a migration appends a history row while the
parent waits, and a family looked up by the moved ``seq`` would be started again.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, TypeVar

from pydantic import ValidationError

from ...definition.fanout import BRANCH_FAILED, CHILDREN, JOINED
from ...definition.spec import BUDGET_EXHAUSTED
from ...errors import InvalidInput
from ...store.base import Store
from ...store.records import (
    COMPLETED,
    PENDING,
    RUNNING,
    WAITING,
    ChildOutput,
    ChildState,
    InstanceRecord,
    StepCommit,
)
from .. import outcome
from ..compiled import CompiledMachine, FanOutPlan

#: (branch name, index, compiled branch machine, branch plan, validated input)
Work = tuple[str, int, CompiledMachine, Any, dict[str, Any]]


K = TypeVar("K", InstanceRecord, ChildState)


def prefix(rec: InstanceRecord) -> str:
    """The id prefix of the children of a family ``rec`` starts now (``_start``)."""
    return f"{rec.id}.{rec.seq}."


def family_number(parent_id: str, kid_id: str) -> int:
    """``N`` of a child id ``{parent_id}.{N}.{index}`` (-1 when it is not of that form)."""
    head = kid_id[len(parent_id) + 1:].partition(".")[0]
    return int(head) if head.isdigit() else -1


def family_prefix(parent_id: str, kids: Sequence[InstanceRecord | ChildState]) -> str | None:
    """The id prefix of the latest family among ``kids`` (all of ``parent_id``'s
    children, of every fan-out it ran; ``None`` when there are none)."""
    if not kids:
        return None
    return f"{parent_id}.{max(family_number(parent_id, k.id) for k in kids)}."


def current(parent_id: str, kids: Sequence[K]) -> list[K]:
    """The children of ``parent_id``'s current fan-out among all its ``kids``: the latest
    family (an earlier visit's families are all final, and older).  A parent waiting on
    a fan-out with items always has one: its first children start in the commit that
    enters it."""
    mine = family_prefix(parent_id, kids)
    return [] if mine is None else [k for k in kids if k.id.startswith(mine)]



def _fit(cm: CompiledMachine, data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} is {type(data).__name__}, not an object fitting "
                           f"{cm.spec.context.__name__}")
    try:
        return cm.spec.context.model_validate(data).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"{what} does not fit {cm.spec.context.__name__}: {first['msg']} at "
                           f"{'.'.join(map(str, first['loc'])) or '(root)'}") from None


def work(cm: CompiledMachine, plan: FanOutPlan, rec: InstanceRecord, start: int = 0,
         stop: int | None = None) -> list[Work]:
    """The branches ``start:stop`` (default: all) of ``rec``'s fan-out with their validated
    input; ``InvalidInput`` naming the first item or branch whose input does not fit."""
    ctx = cm.spec.context.model_validate(rec.context)
    out: list[Work] = []
    if plan.is_map:
        spec, bp, child = plan.spec, plan.branches[0], plan.machines[0]
        items = rec.context.get(spec.items)
        if not isinstance(items, list):
            raise InvalidInput(f"items field {spec.items!r} is not a list")
        for i, item in enumerate(items[start:stop], start=start):
            if spec.input is not None:
                data: Any = dict(spec.input(ctx, item))
            elif spec.item_field is not None:
                data = {**rec.context, spec.item_field: item} if bp.wrapped else \
                    {spec.item_field: item}
            else:
                data = item
            out.append((str(i), i, child, bp, _fit(child, data, f"item {i} of {spec.items!r}")))
        return out
    pairs = list(enumerate(zip(plan.branches, plan.machines, strict=False)))[start:stop]
    for i, (bp, child) in pairs:
        if bp.spec.input is not None:
            data = dict(bp.spec.input(ctx))
        elif bp.wrapped:
            data = dict(rec.context)
        else:
            data = {k: v for k, v in rec.context.items() if k in child.fields}
        out.append((bp.name, i, child, bp, _fit(child, data, f"the input of branch {bp.name!r}")))
    return out


def _child(rec: InstanceRecord, w: Work, now: float, owner: str | None,
           mine: str) -> InstanceRecord:
    """The record of child ``w`` of ``rec``, id ``{mine}{index}`` (``mine``: its family's
    id prefix), with its parent's partition key and priority."""
    name, index, child, _, data = w
    own = child.spec.token_budget
    family = None if rec.token_budget is None else max(0, rec.token_budget - rec.tokens_used)
    budget = min((b for b in (own, family) if b is not None), default=None)
    return InstanceRecord(
        id=f"{mine}{index}", machine=child.name, module=rec.module,
        fingerprint=child.fingerprint, state=child.spec.initial, status=PENDING, context=data,
        input=dict(data), max_transitions=child.spec.max_transitions, token_budget=budget,
        created_at=now, updated_at=now, visits={child.spec.initial: 1}, deadline=rec.deadline,
        parent_id=rec.id, branch=name, machine_version=child.spec.version, owner=owner,
        queue=child.states[child.spec.initial].queue, partition_key=rec.partition_key,
        priority=rec.priority)


def _limit(plan: FanOutPlan) -> int:
    return plan.spec.max_concurrency or 1 << 30


def _start(cm: CompiledMachine, plan: FanOutPlan, new: InstanceRecord, now: float,
           step: StepCommit, owner: str | None) -> StepCommit:
    """Put the first children of ``new``'s fan-out into ``step`` (or fail ``new`` when an
    input does not fit: recorded, nothing started); ``owner``: the worker that will run
    them (``None``: created unowned)."""
    try:
        todo = work(cm, plan, new)
    except InvalidInput as exc:
        step.history.append(outcome.force_fail(cm, new, "invalid_item", now, error=str(exc)))
        return step
    mine = prefix(new)
    step.create = [_child(new, w, now, owner, mine) for w in todo[:_limit(plan)]]
    new.reason = CHILDREN
    new.status, new.owner = (WAITING, None) if step.create else (RUNNING, new.owner)
    if step.history:
        step.history[-1].detail["fan_out"] = {"branches": len(todo)}
    return step


def enter(cm: CompiledMachine, step: StepCommit, now: float,
          owner: str | None = None) -> StepCommit:
    """``step`` moves its instance into a fan-out state: start the family in it too
    (``owner``: see ``_start``)."""
    new = step.record
    plan = cm.fan_outs.get(new.state)
    if plan is None or new.final:
        return step
    return _start(cm, plan, new, now, step, owner)


class Tally:
    """The children of one fan-out, as the completion policy counts them."""

    def __init__(self, plan: FanOutPlan, kids: Sequence[InstanceRecord | ChildState]) -> None:
        self.kids = list(kids)
        self.succeeded = self.failed = self.skipped = 0
        for kid in self.kids:
            if not kid.final:
                continue
            if kid.status == COMPLETED:
                self.succeeded += 1
            elif self._plan(plan, kid).spec.skippable:
                self.skipped += 1
            else:
                self.failed += 1

    @staticmethod
    def _plan(plan: FanOutPlan, kid: InstanceRecord | ChildState) -> Any:
        return plan.branches[0 if plan.is_map else int(kid.id.rsplit(".", 1)[1])]

    @property
    def running(self) -> list[Any]:
        """Children not final yet."""
        return [k for k in self.kids if not k.final]

    def counts(self) -> dict[str, int]:
        """Branch counts for the history and the diagram overlay."""
        return {"succeeded": self.succeeded, "failed": self.failed, "skipped": self.skipped,
                "running": len(self.running)}


def step(cm: CompiledMachine, store: Store, rec: InstanceRecord, now: float,
         owner: str | None = None) -> StepCommit:
    """The commit of one step of ``rec`` in its fan-out state: start, top up and wait, or join
    (``owner``: the worker that will run new children, see ``_start``)."""
    plan = cm.fan_outs[rec.state]
    if rec.reason != CHILDREN:  # entered without a transition (initial state, ``send``)
        new = outcome.clone(rec)
        new.updated_at = now
        return _start(cm, plan, new, now, StepCommit(new, rec.version, before=rec), owner)
    total = len(work_total(plan, rec))
    tally = Tally(plan, _kids(rec, total, store.child_states(rec.id)))
    decided = plan.completion.decide(total, tally.succeeded + tally.skipped, tally.failed)
    outs = _final_outputs(store, rec, tally) if decided is not None else None
    if decided is not None and outs is None:  # some to cancel: read the children in full
        tally = Tally(plan, _kids(rec, total, store.children(rec.id)))
        decided = plan.completion.decide(total, tally.succeeded + tally.skipped, tally.failed)
    if decided is None:
        room = max(0, _limit(plan) - len(tally.running))
        start = len(tally.kids)
        try:
            todo = work(cm, plan, rec, start, start + room) if room else []
        except InvalidInput as exc:  # the context cannot change while waiting: defensive
            return outcome.failed(cm, rec, "invalid_item", now, error=str(exc))
        return _wait(rec, tally, todo, now, owner)
    return join(cm, store, plan, rec, tally, decided, now, outs)


def _kids(rec: InstanceRecord, total: int, kids: Sequence[K]) -> list[K]:
    """The children of ``rec``'s current fan-out of ``total`` items among ``kids`` (none
    for a fan-out of no items: it started no family, the latest is an earlier visit's)."""
    return current(rec.id, kids) if total else []


def _final_outputs(store: Store, rec: InstanceRecord,
                   tally: Tally) -> dict[str, ChildOutput] | None:
    """The outputs by id of ``tally``'s children when all are final (the join's commit is
    fenced on the versions counted, so a child that moved since makes it stale); ``None``
    when some still run (to cancel: the caller reads them in full) or one is not final now."""
    if tally.running:
        return None
    mine = {k.id for k in tally.kids}
    outs = {o.id: o for o in store.child_outputs(rec.id) if o.id in mine}
    return outs if all(k.id in outs for k in tally.kids) else None


def needs_step(cm: CompiledMachine, rec: InstanceRecord, states: Sequence[ChildState]) -> bool:
    """True when a step of ``rec`` (woken in its fan-out state) would do more than wait
    again: the policy is decided, or a slot is free for an item not started yet.  An
    engine running the family skips the other wakes (no claim, no commit)."""
    plan = cm.fan_outs.get(rec.state)
    if plan is None or rec.reason != CHILDREN:
        return True
    total = len(work_total(plan, rec))
    tally = Tally(plan, _kids(rec, total, states))
    if plan.completion.decide(total, tally.succeeded + tally.skipped, tally.failed) is not None:
        return True
    return len(tally.kids) < total and len(tally.running) < _limit(plan)


def _wait(rec: InstanceRecord, tally: Tally, todo: list[Work], now: float,
          owner: str | None) -> StepCommit:
    new = outcome.clone(rec)
    mine = family_prefix(rec.id, tally.kids) or prefix(rec)
    more = [_child(rec, w, now, owner, mine) for w in todo]
    new.status, new.owner, new.updated_at = WAITING, None, now
    return StepCommit(new, rec.version, create=more, before=rec,
                      fence=[(k.id, k.version) for k in tally.running])


def output(plan: FanOutPlan, kid: InstanceRecord | ChildState,
           out: InstanceRecord | ChildOutput | None = None) -> Any:
    """What a finished child contributes: a skipped one its default, a failed one ``None``
    (``out``: where its context and input are, ``kid`` itself by default)."""
    bp = Tally._plan(plan, kid)
    if kid.status != COMPLETED:
        return dict(bp.spec.default_output) if bp.spec.skippable else None
    data = kid if out is None else out
    assert not isinstance(data, ChildState), "a ChildState's output comes with it (out)"
    if bp.wrapped:  # an action's output: the fields it changed
        return {k: v for k, v in data.context.items() if data.input.get(k) != v}
    return dict(data.context)


def _outputs(plan: FanOutPlan, kids: list[Any], total: int,
             outs: dict[str, ChildOutput] | None) -> Any:
    def out(kid: Any) -> Any:
        return output(plan, kid, None if outs is None else outs[kid.id])
    if plan.is_map:
        values: list[Any] = [None] * total
        for kid in kids:
            values[int(kid.id.rsplit(".", 1)[1])] = out(kid) if kid.final else None
        return values
    return {bp.name: None for bp in plan.branches} | {
        kid.branch or "": out(kid) for kid in kids if kid.final}


def _update(plan: FanOutPlan, outputs: Any) -> dict[str, Any]:
    """The reducer's context updates; ``ValueError`` with the reason when it fails."""
    spec = plan.spec
    try:
        value = spec.reducer(outputs) if spec.reducer is not None else outputs
    except Exception as exc:  # noqa: BLE001 - user code: recorded as the reason
        raise ValueError(f"the reducer raised {type(exc).__name__}: {exc}") from exc
    if spec.into is not None:
        return {spec.into: value}
    if not isinstance(value, dict):
        raise ValueError(f"the reducer returned {type(value).__name__}, not a dict of updates")
    return value


def join(cm: CompiledMachine, store: Store, plan: FanOutPlan, rec: InstanceRecord,
         tally: Tally, decided: bool, now: float,
         outs: dict[str, ChildOutput] | None = None) -> StepCommit:
    """The join: take ``joined``/``branch_failed`` with the reduced outputs, the children's
    tokens, their cancellation when still running; fenced on every child read (``outs``:
    the final children's outputs by id when ``tally`` holds ``ChildState``s, all final)."""
    # ChildStates only when every child is final: those are counted, none is cancelled
    also, tokens = cancel_running(store, tally.kids, now, "join")  # type: ignore[arg-type]
    base = outcome.clone(rec)
    base.reason = None
    detail = {"branches": tally.counts(), "children_tokens": tokens}
    step = _decide_join(cm, plan, base, tally, decided, now, tokens, detail, outs)
    step.expected_version, step.before = rec.version, rec
    step.fence = [(k.id, k.version) for k in tally.kids if k.final]
    step.also = also
    return step


def timed_out(store: Store, rec: InstanceRecord, now: float, step: StepCommit) -> StepCommit:
    """``step`` (a timer's fire out of ``rec``'s fan-out state) with the children still
    running cancelled in its commit (reason ``timer``), their tokens added to ``rec``."""
    also, tokens = cancel_running(store, current(rec.id, store.children(rec.id)), now, "timer")
    step.also = [*step.also, *also] if step.also else also
    step.record.tokens_used += tokens
    if step.history:
        step.history[0].tokens += tokens
        step.history[0].detail["children_tokens"] = tokens
    return step


def cancel_running(store: Store, kids: Sequence[InstanceRecord], now: float,
                   reason: str) -> tuple[list[StepCommit], int]:
    """The steps cancelling the ``kids`` still running — with, for one waiting on its own
    children, theirs (at every depth, their tokens added to it) — and the tokens the
    ``kids`` spent, descendants included: what their parent adds to its own."""
    steps: list[StepCommit] = []
    spent = 0
    for kid in kids:
        if kid.final:
            spent += kid.tokens_used
            continue
        step = outcome.cancelled(kid, now, reason=reason)
        if kid.reason == CHILDREN:  # its own family goes with it
            sub, sub_spent = cancel_running(
                store, current(kid.id, store.children(kid.id)), now, reason)
            step.record.tokens_used += sub_spent
            step.history[-1].tokens += sub_spent
            step.history[-1].detail["children_tokens"] = sub_spent
            steps.extend(sub)
        steps.append(step)
        spent += step.record.tokens_used
    return steps, spent


def _decide_join(cm: CompiledMachine, plan: FanOutPlan, base: InstanceRecord, tally: Tally,
                 decided: bool, now: float, tokens: int, detail: dict[str, Any],
                 outs: dict[str, ChildOutput] | None) -> StepCommit:
    from ..values import apply_update
    state = base.state
    fail: dict[str, Any] = dict(tokens=tokens, detail=detail)
    if decided:
        total = len(work_total(plan, base))
        try:
            update = _update(plan, _outputs(plan, tally.kids, total, outs))
            obj, ctx, delta = apply_update(cm.spec.context, base.context, update, cm.fields)
        except ValueError as exc:
            return outcome.failed(cm, base, "reducer_error", now, error=str(exc), **fail)
        except InvalidInput as exc:
            return outcome.failed(cm, base, "invalid_join_output", now,
                                  error=f"the joined outputs do not fit: {exc}", **fail)
        return _taken(cm, base, JOINED, obj, now, fail, context=ctx, delta=delta)
    trigger = BRANCH_FAILED
    if base.token_budget is not None and cm.has_trigger(state, BUDGET_EXHAUSTED) and any(
            k.reason == "token_budget" for k in tally.kids if k.final and k.status != COMPLETED):
        trigger = BUDGET_EXHAUSTED  # the family's budget stopped a branch
    why = f"{tally.failed} of {len(tally.kids)} started branches failed"
    if not cm.has_trigger(state, trigger):
        return outcome.failed(cm, base, "branch_failed", now, error=why, **fail)
    return _taken(cm, base, trigger, cm.spec.context.model_validate(base.context), now, fail,
                  error=why, reason="token_budget" if trigger == BUDGET_EXHAUSTED
                  else BRANCH_FAILED)


def _taken(cm: CompiledMachine, base: InstanceRecord, trigger: str, obj: Any, now: float,
           fail: dict[str, Any], **moved: Any) -> StepCommit:
    """The join's ``trigger`` taken to the first of its transitions whose guards pass on
    the context after the join (``obj``; the guards' ``RunInfo`` counts the children's
    tokens), the guards' results in the row, as for any guarded edge: none passing fails
    the parent with reason ``no_transition``, a guard raising with reason ``error``."""
    from ..compiled import GuardResultError
    from ..step import run_info
    evaluated: list[list[Any]] = []
    run = partial(run_info, base, cm.states[base.state], fail["tokens"])
    try:
        choice = cm.choose(base.state, obj, run, trigger, evaluated)
    except Exception as exc:  # noqa: BLE001 - a guard raising fails this parent, not the batch
        why = str(exc) if isinstance(exc, GuardResultError) else \
            f"a guard raised {type(exc).__name__}: {exc}"
        return outcome.failed(cm, base, "error", now, error=why, guards=evaluated, **fail)
    if choice is None:
        return outcome.failed(cm, base, "no_transition", now, guards=evaluated,
                              error=f"no {trigger!r} transition from {base.state!r} passed "
                              "its guards", **fail)
    return outcome.transition(cm, base, trigger=trigger, dest=choice.dest, now=now,
                              kind="join", guards=choice.guards, **fail, **moved)


def work_total(plan: FanOutPlan, rec: InstanceRecord) -> list[Any]:
    """The items (``Map``) or branches (``Parallel``) of ``rec``'s fan-out."""
    if plan.is_map:
        items = rec.context.get(plan.spec.items)
        return items if isinstance(items, list) else []
    return list(plan.branches)


def propagate(store: Store, step: StepCommit, now: float) -> StepCommit:
    """Family effects of an ordinary commit: a child that ends wakes its parent; a parent
    that ends while its children run (cancelled, deadline, loop cap) cancels them with it."""
    new, before = step.record, step.before
    if not new.final or (before is not None and before.final):
        return step
    if new.parent_id is not None and step.wake is None:
        step.wake = new.parent_id
    was_waiting = before.reason == CHILDREN if before is not None else new.reason == CHILDREN
    if was_waiting and not step.fence and not step.also:
        step.also, spent = cancel_running(
            store, current(new.id, store.children(new.id)), now,
            "parent_" + (new.reason or "ended"))
        new.tokens_used += spent  # the family's tokens, as a join would have added them
        if step.history:
            step.history[-1].tokens += spent
            step.history[-1].detail["children_tokens"] = spent
    return step


def family_left(store: Store, rec: InstanceRecord) -> int | None:
    """Tokens child ``rec`` may still spend for its ancestors: the least, over every
    ancestor with a ``token_budget``, of that budget minus what its whole family has spent
    (``spent``); ``None`` when no ancestor has a budget."""
    left: int | None = None
    node = rec
    while node.parent_id is not None:
        node = store.get(node.parent_id)
        if node.token_budget is not None:
            mine = node.token_budget - spent(store, node)
            left = mine if left is None else min(left, mine)
    return left


def spent(store: Store, rec: InstanceRecord) -> int:
    """Tokens ``rec`` and its descendants spent so far: its ``tokens_used`` (which holds the
    families it joined) plus, while it waits on a fan-out, its children's (recursively)."""
    total = rec.tokens_used
    if rec.final or rec.reason != CHILDREN:
        return total
    for kid in current(rec.id, store.child_states(rec.id)):
        waiting = not kid.final and kid.reason == CHILDREN
        total += spent(store, store.get(kid.id)) if waiting else kid.tokens_used
    return total
