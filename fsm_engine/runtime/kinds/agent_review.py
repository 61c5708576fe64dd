"""Approval of an agent's tool calls: the review item of one call, and its decision.

A call of a tool in ``Agent.approve`` opens a review item (``show``: the tool, its
validated arguments, the turn and call id; ``editable``: the argument names) and the
instance waits, holding no worker.  ``approve`` journals the approved arguments (the
reviewer's edit merged over the model's, validated again by the tool's argument model)
and the loop goes on with the call; ``reject`` takes the state's ``rejected`` outcome.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from ...definition.agent import REJECTED, Agent
from ...errors import ActionError, InvalidInput, ReviewRefused
from ...store.records import WAITING, InstanceRecord, ReviewDecision, ReviewItem, StepCommit
from .. import outcome
from ..compiled import CompiledMachine
from . import agent_journal as journal


def item_id(instance_id: str, state: str, visit: int, call: str) -> str:
    """The id of the review item of one call: 12 hex digits of SHA-256."""
    key = f"{instance_id}\x00{state}\x00{visit}\x00{call}".encode()
    return hashlib.sha256(key).hexdigest()[:12]


def ask(rec: InstanceRecord, agent: Agent, call: dict[str, Any], args: dict[str, Any],
        visit: int, now: float) -> StepCommit:
    """The commit putting ``call`` (arguments ``args``) to review: an ``ask`` row, the
    item opened (its SLA timer as ``next_attempt_at``), the instance waiting unowned."""
    item = _item(rec, agent, call, args, visit, now)
    detail = {"agent": "ask", "visit": visit, "turn": item.show["turn"], "call": call["id"],
              "tool": item.show["tool"], "arguments": args, "item": item.id}
    return journal.entry(rec, detail, now, waiting=True, review=item)


def reopened(rec: InstanceRecord, agent: Agent, call: dict[str, Any], args: dict[str, Any],
             visit: int, now: float) -> StepCommit:
    """The commit opening ``rec``'s own item for ``call`` whose ``ask`` row it holds
    already but whose item is another instance's (a fork copied the row from its
    original): no row, the item opened, the instance waiting unowned — as a fork of a
    review state opens its own item (``outcome.awaiting_review``)."""
    item = _item(rec, agent, call, args, visit, now)
    new = outcome.clone(rec)
    new.status, new.owner, new.updated_at, new.attempt = WAITING, None, now, 1
    new.next_attempt_at = item.due_at
    return StepCommit(new, rec.version, before=rec, review_open=item)


def _item(rec: InstanceRecord, agent: Agent, call: dict[str, Any], args: dict[str, Any],
          visit: int, now: float) -> ReviewItem:
    """``rec``'s review item of ``call`` (see the module doc)."""
    tool = agent.by_name[call["tool"]]
    turn = int(call["id"].split(".")[0])
    return ReviewItem(
        id=item_id(rec.id, rec.state, visit, call["id"]), instance_id=rec.id,
        machine=rec.machine, state=rec.state, visit=visit,
        prompt=f"Allow the call of tool {tool.name}? {tool.description}"[:500],
        show={"tool": tool.name, "arguments": args, "turn": turn, "call": call["id"]},
        choices=["approve", "reject"], editable=list(tool.args.model_fields if tool.args else ()),
        created_at=now, due_at=None if agent.sla_s is None else now + agent.sla_s,
        on_timeout=agent.on_timeout)


def _refuse(item: ReviewItem, why: str) -> ReviewRefused:
    return ReviewRefused(f"review {item.id}: {why}; nothing was written", item_id=item.id,
                         instance_id=item.instance_id)


def decision(cm: CompiledMachine, rec: InstanceRecord, item: ReviewItem, choice: str, *,
             by: str, now: float, advance: Callable[..., StepCommit],
             edit: Mapping[str, Any], note: str | None, claimer: str | None) -> StepCommit:
    """The commit of ``choice`` on the item of an agent's call (the common checks done by
    ``reviews.decision``); ``ReviewRefused`` when the edited arguments do not validate."""
    state = cm.states[item.state]
    assert state.agent is not None
    tool = state.agent.by_name.get(str(item.show.get("tool")))
    if tool is None:
        raise _refuse(item, f"tool {item.show.get('tool')!r} is no longer declared")
    try:
        args = tool.validate({**dict(item.show.get("arguments") or {}), **edit})
    except ValueError as exc:
        raise _refuse(item, f"edit rejected: {exc}") from None
    review = {"item": item.id, "by": by, "note": note, "edit": dict(edit)}
    if choice == "reject":
        try:
            commit = advance(cm, rec, state, None, REJECTED, {}, 0.0, kind="review",
                             reason="rejected")
        except (InvalidInput, ActionError) as exc:
            raise _refuse(item, str(exc)) from None
        commit.history[0].detail["review"] = review
    else:
        detail = {"agent": "decision", "visit": item.visit, "turn": item.show.get("turn"),
                  "call": item.show.get("call"), "tool": tool.name, "arguments": args,
                  "choice": choice, "review": review}
        commit = journal.entry(rec, detail, now)  # owner kept: none after a person's
        # decision (a waiting instance is unowned), the worker's after the SLA timer's
    commit.before = rec
    commit.review_close = ReviewDecision(item.id, by, now, choice, note, dict(edit) or None,
                                         claimer)
    return commit
