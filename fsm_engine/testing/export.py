"""A stored instance as a test case (``fsm export-test ID -o tests/test_case_ID.py``).

``case_from_store`` reads the instance's input, its recorded model replies (the
``llm_calls`` entries of its history rows: ``reply`` text and token counts; a call that
failed becomes a scripted ``error`` of its kind), the provider errors of its failed attempts
(``Store.attempts``), its review decisions (an agent's tool-call approvals and rejections
included, each with the choice its item recorded; ``"timeout"`` for one its SLA timer took,
and for each fire of a timer edge), the operator moves of ``fsm send`` and ``fsm rerun
--in-place`` (in order among the decisions), its deadline and token budget, the machine version
its input was given to (``version``: a migrated instance's replay upcasts it), what each
successful action returned (its row's ``delta``: side-effect states replay from it, never
delivering again), what each side-effect tool call of an agent returned (``tool_results``:
the tool is never run again, ``cases``), and what it did: its transitions, final state,
status and context. An instance with fan-out children brings their replies and decisions
too, each keyed by its caller's input (``input`` in the script line and the decision), since
children run at once. An instance an operator cancelled is refused (``InvalidInput``, one
line): when the cancel came is not something a replay can reproduce. A fan-out descendant
that delivered a side effect brings what its actions and side-effect tools returned
(``branch_results``, keyed by its input): a replay delivers none of them again.
``write_test`` writes a pytest file holding that case as JSON, which replays it through the
current machine on the virtual clock (``cases.assert_case``) and fails naming the first
divergent transition.

How the instance was started is not recorded, as for a delayed start (``delay_s``) or a
priority: a tick of a schedule, a start under a key or a debounced burst replays as one plain
start of its input.  The written file replays its case through ``assert_case``, so a case
given by hand with ``schedule``, ``key`` or ``debounce`` (``case_starts``) replays there too.

Every string written passes through ``fsm_engine.redaction.redact``, and the value of a
field whose name says it holds a secret (``secret_name``: ``password``, ``api_key``, …, not
``author`` or ``passage``) is masked: a credential in an input, a reply or a context value
is never written.  An output field a mask changed is not asserted (the replay cannot know
the secret).  The file holds the case as one JSON string literal (``repr``): no stored
value is ever spliced into it as source.  Other actions run again
(what they read from the world — files, tools, HTTP — is not replayed unless the case's
``stub`` names them); an attempt that failed in the action itself (not in a model call)
is not replayed either.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidInput
from ..redaction import MASK, redact, secret_name
from ..store.records import NOT_MOVES, TOOL, AttemptRow, HistoryRow, InstanceRecord

__all__ = ["case_from_store", "write_test", "scrub"]

#: Provider error classes → the scripted provider's ``error`` kinds.
_ERRORS = {"ProviderTimeout": "timeout", "ProviderUnavailable": "unavailable",
           "RateLimited": "http429", "ServerError": "http500", "ClientError": "http400"}
_SLA = "sla-timer"  # runtime.kinds.reviews.SLA


def scrub(value: Any) -> Any:
    """``value`` (JSON) with every string passed through ``redact`` (keys too), and the
    scalar value of a key whose name says it holds a secret masked (``MASK``)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k): MASK if _masked(k, v) else scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def _masked(key: Any, value: Any) -> bool:
    return (isinstance(key, str) and secret_name(key) and value not in ("", None)
            and isinstance(value, str | int | float) and not isinstance(value, bool))


def _error_kind(text: str | None) -> str | None:
    """The scripted kind of a recorded error (``ProviderUnavailable(...)``, or an attempt's
    class name), None when it is not a provider error."""
    name = re.match(r"[A-Za-z_]\w*", text or "")
    return _ERRORS.get(name.group(0)) if name else None


def _call_lines(row: HistoryRow) -> list[dict[str, Any]]:
    out = []
    for call in row.detail.get("llm_calls", ()):
        if isinstance(call.get("reply"), str) and call.get("error") is None:
            out.append({"text": call["reply"],
                        "prompt_tokens": int(call.get("prompt_tokens") or 0),
                        "completion_tokens": int(call.get("completion_tokens")
                                                 or call.get("tokens") or 0),
                        "finish_reason": call.get("finish_reason") or "stop"})
        elif (kind := _error_kind(call.get("error"))) is not None:
            out.append({"error": kind, "completion_tokens": int(call.get("tokens") or 0)})
    return out


def _replies(history: Sequence[HistoryRow], attempts: Sequence[AttemptRow]) -> list[dict[str, Any]]:
    """The model's answers in the order they were given: failed attempts (by time) before
    the row that followed them."""
    events: list[tuple[float, int, list[dict[str, Any]]]] = []
    for a in attempts:
        kind = _error_kind(a.error_class)
        if kind is not None:
            events.append((a.at, 0, [{"error": kind, "completion_tokens": a.tokens}]))
    for h in history:
        events.append((h.at, 1, _call_lines(h)))
    events.sort(key=lambda e: (e[0], e[1]))
    return [line for _, _, lines in events for line in lines]


def _choice(store: Any, h: HistoryRow, review: dict[str, Any]) -> str:
    """The choice a review row recorded: its item's (an agent's ``reject`` moves on the
    trigger ``rejected``), else the row's trigger (an item pruned)."""
    item = review.get("item")
    found = store.reviews(id_prefix=item) if isinstance(item, str) and item else []
    choice = next((i.choice for i in found if i.id == item and i.choice), None)
    return choice or h.trigger


def _operator_move(h: HistoryRow) -> dict[str, Any] | None:
    """The decision replaying an operator's move (``fsm send``, ``fsm rerun --in-place``)."""
    if h.kind == "rerun":
        return {"rerun": h.dest, "by": h.detail.get("operator")}
    if h.kind == "transition" and (h.detail.get("sent") or "operator" in h.detail):
        return {"send": h.trigger, "update": dict(h.delta), "by": h.detail.get("operator")}
    return None


def _decisions(store: Any, history: Sequence[HistoryRow]) -> list[Any]:
    """One instance's decisions and operator moves, in order (``cases``)."""
    out: list[Any] = []
    for h in history:
        review = h.detail.get("review") if h.kind in ("review", TOOL) else None
        if h.kind == TOOL and h.detail.get("agent") != "decision":
            review = None
        if h.kind == "timer":  # a timer edge fired: the case lets the next timer fire
            out.append("timeout")
        elif review is None:
            move = _operator_move(h)
            if move is not None:
                out.append(move)
        elif review.get("by") == _SLA:
            out.append("timeout")
        else:
            choice = h.detail["choice"] if h.kind == TOOL else _choice(store, h, review)
            out.append({"choice": choice, "by": review.get("by") or "case",
                        "update": review.get("edit") or None, "note": review.get("note")})
    return out


def _family(store: Any, rec: InstanceRecord) -> list[InstanceRecord]:
    """``rec`` and its fan-out descendants, parents first."""
    out, todo = [], [rec]
    while todo:
        one = todo.pop(0)
        out.append(one)
        todo += store.children(one.id)
    return out


def _family_replies(store: Any, family: list[InstanceRecord]) -> list[dict[str, Any]]:
    """The replies of ``family[0]`` and, when it has fan-out children, of each of them,
    keyed by the calling instance's input (children run at once: each must get its own)."""
    if len(family) == 1:
        return _replies(store.history(family[0].id), store.attempts(family[0].id))
    return [{**line, "input": one.input} for one in family
            for line in _replies(store.history(one.id), store.attempts(one.id))]


def _family_decisions(store: Any, family: list[InstanceRecord]) -> list[Any]:
    """The decisions of ``family[0]``, then each descendant's keyed by its ``input``."""
    out = _decisions(store, store.history(family[0].id))
    for one in family[1:]:
        for d in _decisions(store, store.history(one.id)):
            if d == "timeout":
                d = {"timeout": True}
            elif "choice" not in d:
                raise InvalidInput(f"instance {family[0].id}: an operator moved its fan-out "
                                   f"child {one.id} (fsm send / fsm rerun), which an exported "
                                   "test does not replay")
            out.append({**d, "input": one.input})
    return out


def _tool_results(history: Sequence[HistoryRow]) -> dict[str, list[dict[str, Any]]]:
    """What each delivered side-effect tool call returned, by state (``cases``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for h in history:
        d = h.detail
        if h.kind != TOOL or d.get("agent") != "call" or not (
                d.get("idempotency_key") or d.get("delivered_by_original")):
            continue
        entry = {"visit": d.get("visit"), "call": d.get("call"), "tool": d.get("tool"),
                 "arguments": d.get("arguments")}
        entry.update({"error": d["error"]} if "error" in d else {"result": d.get("result")})
        out.setdefault(h.source, []).append(entry)
    return out


def _branch_results(store: Any, family: list[InstanceRecord]) -> list[dict[str, Any]]:
    """For each fan-out descendant that delivered a side effect (its outbox holds a row):
    its input, what its actions returned and its side-effect tool calls (``cases``)."""
    out = []
    for one in family[1:]:
        if store.outbox(one.id):
            history = store.history(one.id)
            out.append({"input": one.input, "results": _results(history),
                        "tool_results": _tool_results(history)})
    return out


def _results(history: Sequence[HistoryRow]) -> dict[str, list[dict[str, Any]]]:
    """What each successful action returned, by state in visit order."""
    results: dict[str, list[dict[str, Any]]] = {}
    for h in history:
        if h.kind == "transition":
            results.setdefault(h.source, []).append(h.delta)
    return results


def _started_at_version(rec: InstanceRecord, history: Sequence[HistoryRow]) -> int:
    """The machine version ``rec``'s input was given to: its first migration's source."""
    for h in history:
        if h.kind == "migration" and isinstance(h.detail.get("from_version"), int):
            return int(h.detail["from_version"])
    return rec.machine_version


def _refuse_cancelled(rec: InstanceRecord, history: Sequence[HistoryRow]) -> None:
    for h in history:
        if h.kind == "cancel":
            raise InvalidInput(f"instance {rec.id} was cancelled (history row {h.seq}): an "
                               "exported test cannot replay when a cancel came")


def case_from_store(store: Any, rec: InstanceRecord) -> dict[str, Any]:
    """The case replaying ``rec`` (see the module docstring), secrets masked."""
    history = store.history(rec.id)
    _refuse_cancelled(rec, history)
    family = _family(store, rec)
    case: dict[str, Any] = {
        "name": f"instance {rec.id}", "input": rec.input,
        "replies": _family_replies(store, family),
        "decisions": _family_decisions(store, family),
        "moves": [[h.source, h.trigger, h.dest] for h in history if h.kind not in NOT_MOVES],
        "final": rec.state, "status": rec.status, "tool_results": _tool_results(history),
    }
    results = _results(history)  # side-effect states replay from it
    if results:
        case["results"] = results
    if len(family) > 1:  # with it, no child's side effect runs in the replay
        case["branch_results"] = _branch_results(store, family)
    case["version"] = _started_at_version(rec, history)  # a migrated one's input: older
    if rec.deadline is not None:
        case["deadline_s"] = max(0.0, rec.deadline - rec.created_at)
    if rec.token_budget is not None:
        case["token_budget"] = rec.token_budget
    case = scrub(case)
    case["output"] = {k: v for k, v in scrub(rec.context).items()
                      if k in rec.context and v == rec.context[k]}  # a masked field: unasserted
    return case


_TEMPLATE = '''"""Replays instance {iid} (written by ``fsm export-test``).

Its input, recorded model replies, failed attempts and review decisions run through the
current machine on the virtual clock; the test fails naming the first transition that
differs from the recorded run, or the final state or output field that does.
"""

import json

from fsm_engine.testing.cases import assert_case

MACHINE = {module!r}
CASE = json.loads({blob!r})


def test_{name}() -> None:
    assert_case(MACHINE, CASE)
'''


def write_test(path: str, case: dict[str, Any], module: str) -> None:
    """Write the pytest file replaying ``case`` through the machine of ``module``."""
    iid = str(case["name"]).removeprefix("instance ")
    name = re.sub(r"\W", "_", f"case_{iid}")
    if keyword.iskeyword(name) or not name.isidentifier():
        name = "case"
    text = _TEMPLATE.format(iid=re.sub(r"[^\w-]", "_", iid), module=module, name=name,
                            blob=json.dumps(case, ensure_ascii=True, sort_keys=True))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
