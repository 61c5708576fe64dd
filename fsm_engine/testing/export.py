"""A stored instance as a test case (``fsm export-test ID -o tests/test_case_ID.py``).

``case_from_store`` reads the instance's input, its recorded model replies (the
``llm_calls`` entries of its history rows: ``reply`` text and token counts; a call that
failed becomes a scripted ``error`` of its kind), the provider errors of its failed
attempts (``Store.attempts``), its review decisions (``"timeout"`` for one its SLA timer
took), its deadline and token budget, what each successful action returned (its row's
``delta``: side-effect states replay from it, never delivering again), and what it did:
its transitions, final state, status and context.  An instance with fan-out children brings their replies too, each
keyed by its caller's input (``input`` in the script line), since children run at once.
``write_test`` writes a pytest file holding that case as JSON, which replays it through
the current machine on the virtual clock (``cases.assert_case``) and fails naming the
first divergent transition.

Every string written passes through ``fsm_engine.redaction.redact``: a credential in an
input, a reply or a context value is masked, never written.  Other actions run again
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

from ..redaction import redact
from ..store.records import NOT_MOVES, AttemptRow, HistoryRow, InstanceRecord

__all__ = ["case_from_store", "write_test"]

#: Provider error classes → the scripted provider's ``error`` kinds.
_ERRORS = {"ProviderTimeout": "timeout", "ProviderUnavailable": "unavailable",
           "RateLimited": "http429", "ServerError": "http500", "ClientError": "http400"}
_SLA = "sla-timer"  # runtime.kinds.reviews.SLA


def _scrub(value: Any) -> Any:
    """``value`` with every string passed through ``redact`` (keys too)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


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


def _decisions(history: Sequence[HistoryRow]) -> list[Any]:
    out: list[Any] = []
    for h in history:
        review = h.detail.get("review") if h.kind == "review" else None
        if review is None:
            continue
        if review.get("by") == _SLA:
            out.append("timeout")
        else:
            out.append({"choice": h.trigger, "by": review.get("by") or "case",
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


def _family_replies(store: Any, rec: InstanceRecord) -> list[dict[str, Any]]:
    """The replies of ``rec`` and, when it has fan-out children, of each of them, keyed by
    the calling instance's input (children run at once: each must get its own)."""
    family = _family(store, rec)
    if len(family) == 1:
        return _replies(store.history(rec.id), store.attempts(rec.id))
    return [{**line, "input": one.input} for one in family
            for line in _replies(store.history(one.id), store.attempts(one.id))]


def case_from_store(store: Any, rec: InstanceRecord) -> dict[str, Any]:
    """The case replaying ``rec`` (see the module docstring), secrets masked."""
    history = store.history(rec.id)
    case: dict[str, Any] = {
        "name": f"instance {rec.id}", "input": rec.input,
        "replies": _family_replies(store, rec), "decisions": _decisions(history),
        "moves": [[h.source, h.trigger, h.dest] for h in history if h.kind not in NOT_MOVES],
        "final": rec.state, "status": rec.status, "output": rec.context,
    }
    results: dict[str, list[dict[str, Any]]] = {}
    for h in history:  # what each successful action returned (side effects replay from it)
        if h.kind == "transition":
            results.setdefault(h.source, []).append(h.delta)
    if results:
        case["results"] = results
    if rec.deadline is not None:
        case["deadline_s"] = max(0.0, rec.deadline - rec.created_at)
    if rec.token_budget is not None:
        case["token_budget"] = rec.token_budget
    return _scrub(case)


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
