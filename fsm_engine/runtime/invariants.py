"""The runtime's invariants over a whole store, for ``fsm check`` (issue 19).

Each check reads the store through its public API (no backend SQL) and returns one line
per violation, naming the instance and the reason:

- **duplicate children**: two families of one parent started in one visit of its fan-out
  state (no move row of the parent between them: a takeover started the family again),
  or one branch twice in a family;
- **never woken**: a parent ``waiting`` on ``children`` whose current family is all final
  (the commit ending the last child should have woken it);
- **a wait nothing can end**: an instance ``waiting`` on a tool call's approval, or in a
  review state, with no open review item of its own for that visit, or in a state that
  waits on nothing (no trigger, review, approval, children, rate limit or timer; read from
  the definition stored with it, when there is one);
- **outbox key delivered twice**: one idempotency key on two completed steps;
- **history does not replay**: the input with every history row's delta applied is not
  the stored context, or the stored ``tokens_used`` is less than the history's and
  failed attempts' tokens.

The backend's own checks (``Store.check``: seq gaps, state vs last row, orphans) come
first in ``fsm check``; these read every instance's history (one read per instance).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ..definition.fanout import CHILDREN
from ..errors import FsmError
from ..store.base import Store
from ..store.records import (
    NOT_MOVES,
    RATE_LIMITED,
    RECOVERY,
    REVIEW_OPEN,
    WAITING,
    HistoryRow,
    InstanceRecord,
)
from ..views import context_after
from .kinds import agent_journal, fanout
from .kinds.agent_review import item_id


def check(store: Store) -> list[str]:
    """Every invariant violation found in ``store``, one line each (``[]``: healthy)."""
    records = store.list()
    histories = {r.id: store.history(r.id) for r in records}
    kids: dict[str, list[InstanceRecord]] = defaultdict(list)
    for rec in records:
        if rec.parent_id is not None:
            kids[rec.parent_id].append(rec)
    problems: list[str] = []
    for rec in records:
        family = kids.get(rec.id, [])
        problems += duplicate_children(rec, family, histories[rec.id])
        problems += never_woken(rec, family)
        problems += unending_wait(rec, histories[rec.id], store)
        problems += replays(rec, histories[rec.id], store)
    return problems + delivered_twice(histories.values())


def _epoch(rows: Sequence[HistoryRow], number: int) -> int:
    """How many moves (rows that are not a takeover or a migration) the parent had made by
    history row ``number``: one visit of a fan-out state starts one family per epoch."""
    return sum(1 for r in rows if r.seq <= number and r.kind not in NOT_MOVES)


def duplicate_children(rec: InstanceRecord, kids: Sequence[InstanceRecord],
                       rows: Sequence[HistoryRow]) -> list[str]:
    """Families of ``rec`` started twice for one visit, and branches twice in a family."""
    families: dict[int, list[InstanceRecord]] = defaultdict(list)
    for kid in kids:
        families[fanout.family_number(rec.id, kid.id)].append(kid)
    out = []
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for number in sorted(families):
        by_epoch[_epoch(rows, number)].append(number)
        twice = sorted(b for b, n in Counter(k.branch for k in families[number]).items()
                       if n > 1 and b is not None)
        if twice:
            out.append(f"instance {rec.id}: branch(es) {', '.join(twice)} started twice in "
                       f"family {rec.id}.{number}.*")
    for numbers in by_epoch.values():
        if len(numbers) > 1:
            names = ", ".join(f"{rec.id}.{n}.*" for n in numbers)
            out.append(f"instance {rec.id}: duplicate children: {len(numbers)} families "
                       f"({names}) started for one visit of its fan-out state")
    return out


def never_woken(rec: InstanceRecord, kids: Sequence[InstanceRecord]) -> list[str]:
    """``rec`` waits on its children although every child of its current family is final."""
    if rec.status != WAITING or rec.reason != CHILDREN:
        return []
    family = fanout.current(rec.id, kids)
    if family and all(k.final for k in family):
        return [f"instance {rec.id}: waiting on its children, but all {len(family)} are "
                "final (never woken)"]
    return []


def unending_wait(rec: InstanceRecord, rows: Sequence[HistoryRow], store: Store) -> list[str]:
    """``rec`` waits on something nothing can end (see the module doc; ``rows``: its
    history)."""
    if rec.status != WAITING or rec.reason in (CHILDREN, RATE_LIMITED):
        return []
    visit = rec.visits.get(rec.state, 1)
    mine = {i.id for i in store.reviews(statuses=[REVIEW_OPEN], instance_id=rec.id)
            if (i.state, i.visit) == (rec.state, visit)}
    j = agent_journal.read(list(rows), rec.state, visit)
    asked = [a for c, a in j.asked.items() if c not in j.decided and c not in j.done]
    where = f"instance {rec.id}: waiting in state {rec.state!r}"
    if asked:
        call = str(asked[-1].get("call"))
        if item_id(rec.id, rec.state, visit, call) in mine:
            return []
        return [f"{where} on the approval of call {call} (tool {asked[-1].get('tool')}), "
                "but no open review item of this instance is there: nothing can end the "
                "wait"]
    spec = _state_spec(store, rec)
    if spec is None or spec.get("wait") or spec.get("fan_out") or mine:
        return []
    if spec.get("review") or spec.get("agent"):
        what = "a review" if spec.get("review") else "a tool call's approval"
        return [f"{where} for {what}, but no open review item of this instance is there: "
                "nothing can end the wait"]
    if rec.next_attempt_at is None:
        return [f"{where}, which waits on nothing (no trigger, review, approval, children "
                "or timer): nothing can end the wait"]
    return []


def _state_spec(store: Store, rec: InstanceRecord) -> dict[str, Any] | None:
    """The export of ``rec``'s state in the definition stored with it (None: none)."""
    try:
        row = store.get_definition(rec.machine, rec.machine_version, rec.fingerprint)
    except FsmError:  # a damaged definition row: nothing to read the state from
        return None
    states = row.export.get("states") if row is not None else None
    # (by hand: a stored export is store.definitions.StoredExport, its states a list read
    # as the diagram reads them; only the one named is picked out here)
    return next((s for s in states or () if isinstance(s, dict)
                 and s.get("name") == rec.state), None)


def replays(rec: InstanceRecord, rows: Sequence[HistoryRow], store: Store) -> list[str]:
    """``rec``'s history folded (input + deltas; tokens) disagrees with its stored row."""
    out = []
    moves = [r for r in rows if r.kind != RECOVERY]
    folded = context_after(rec, moves)[-1] if moves else dict(rec.input)
    changed = sorted(k for k in set(folded) | set(rec.context)
                     if folded.get(k, _MISSING) != rec.context.get(k, _MISSING))
    if changed:
        out.append(f"instance {rec.id}: history does not replay to the row: context field(s) "
                   f"{', '.join(changed)} differ from the input with the deltas applied")
    billed = sum(r.tokens for r in rows) + sum(a.tokens for a in store.attempts(rec.id))
    if rec.tokens_used < billed:
        out.append(f"instance {rec.id}: history does not replay to the row: tokens_used "
                   f"{rec.tokens_used} < {billed} billed by its history and attempts")
    return out


_MISSING = object()


def delivered_twice(histories: Iterable[Sequence[HistoryRow]]) -> list[str]:
    """Idempotency keys recorded on more than one completed step (a side effect delivered
    twice under one key)."""
    seen: dict[str, list[str]] = defaultdict(list)
    for rows in histories:
        for row in rows:
            key = row.detail.get("idempotency_key")
            if isinstance(key, str) and row.kind not in ("fail", *NOT_MOVES):
                seen[key].append(f"{row.instance_id}#{row.seq}")
    return [f"instance {where[0].split('#')[0]}: outbox key {key} delivered twice "
            f"(history rows {', '.join(where)})" for key, where in seen.items() if len(where) > 1]
