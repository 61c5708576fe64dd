"""Example cases of a machine, run on the virtual clock (``fsm test``, exported tests).

A case is a plain-JSON object:

* ``name`` (str), ``input`` (the start input, an object);
* ``replies``: the scripted model replies, in order (``fsm_engine.llm.scripted`` lines:
  ``text``, ``error``, ``delay_s`` …; ``delay_s`` is virtual); without it a model call
  fails (``ClientError``), so a case that calls the model must script it;
* ``decisions``: review decisions and operator moves, in order: ``{"choice", "by",
  "update", "note"}`` decides the case instance's open review item (a tool call's
  approval included), and with ``"input"`` (and ``"state"``) the item of the fan-out
  descendant started with that input (in whichever order they wait); ``"timeout"`` lets
  the review's SLA timer decide (``{"timeout": true, "input"}``: a descendant's);
  ``{"send": TRIGGER, "update", "by"}`` fires a trigger on the waiting instance
  (``fsm send``); ``{"rerun": STATE, "by"}`` reruns the ended instance in place from
  ``STATE`` (``fsm rerun --in-place``); ``{"advance": SECONDS}`` moves the clock on,
  firing the timers (timer edges, SLAs) due meanwhile at their times, in order; with no
  decision left, a waiting instance's next timer fires (the clock moved to it);
* ``deadline_s``, ``token_budget``, ``priority``, and ``delay_s`` (``Engine.start``'s
  ``delay``: the instance starts ``scheduled``; the virtual clock makes it due at once):
  as ``Engine.start`` takes them; ``version``: the
  machine version ``input`` was given to (an int; default: the machine's): an older one's
  input is first passed through the machine's ``migrations`` after it, in order, as
  ``fsm migrate`` upcasts a stored context;
* ``results``: recorded action results, ``{state: [update, …]}`` in visit order, and
  ``stub``: the states whose action is replaced by them (default: with ``results``, the
  machine's side-effect states, so a replay never delivers again); a stubbed action
  called more often than recorded fails its step; ``tool_results``: the recorded calls of
  agents' side-effect tools, ``{state: [{"visit", "call", "tool", "arguments", "result"
  | "error"}, …]}``: with it, every side-effect tool is answered from them and never run;
  ``branch_results``: ``[{"input", "results", "tool_results"}, …]``, the same for the
  fan-out descendant started with that input: with it, every branch machine's
  side-effect states and tools are answered from them (``case_stubs``);
* how the instances start (``case_starts``): ``key`` (an idempotent start key: repeated
  starts must return the case's instance), ``debounce`` (``{"key", "window_s",
  "max_wait_s", "inputs"}``: a burst of starts that must collapse into one instance, the
  last input's) or ``schedule`` (``{"every": "10s"}`` or ``{"cron", "tz"}``, with
  ``ticks``, ``overlap``, ``catchup``: the schedule is added, the clock moved to each of
  its next ``ticks`` ticks, each tick's instance run; exactly one per tick);
* what to expect, each optional: ``path`` (the states entered, initial first), ``moves``
  (``[source, trigger, dest]`` per transition), ``final`` (the last state), ``status``
  and ``output`` (context fields and their values), checked on every instance the case
  started (a schedule's ticks: each problem names its tick); ``instances``: how many
  instances its starts made.

A module gives its cases as ``CASES`` (a list), else a file ``<module>_cases.jsonl``
beside it holds one case per line.  Each case runs in one store shared by the module's
cases (so their coverage is computed from it), on a fresh engine and a fresh
``VirtualClock``; a run that waits on a review with no decision left, and no timer, ends.
While cases run, the built-in sink (``FSM_NOTIFY_URL`` / ``FSM_NOTIFY_FILE``) writes into
their temporary folder: a case's side effects never reach a configured receiver.  Cases
run without a circuit breaker (its state lives in the shared store, so one case's errors
would open it for the next): a ``circuit_open`` exit is not reachable from a case.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import json_input
from ..errors import InvalidInput
from . import case_starts
from .clock import VirtualClock

__all__ = ["CaseResult", "cases_of", "run_case", "run_cases", "assert_case",
           "first_divergence"]

_KEYS = {"name", "input", "replies", "decisions", "deadline_s", "token_budget", "path",
         "moves", "final", "status", "output", "results", "stub", "tool_results",
         "branch_results", "version", "delay_s", "priority", *case_starts.KEYS}
#: A script no call fits: a case without ``replies`` fails any model call it makes.
_NO_MODEL = [{"match": "\x00no model call is scripted for this case\x00", "text": ""}]


@dataclass
class CaseResult:
    """One case's run: the path taken and what differed from the expectation."""

    name: str
    path: list[str]
    moves: list[list[str]]
    state: str
    status: str
    context: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the run matched every expectation of its case."""
        return not self.problems


def _module_of(ref: str, machine: Any) -> Any:
    """The module ``load_machine(ref)`` imported (already loaded: no code runs again)."""
    from ..runtime import loader
    target, _ = loader._split(ref)
    try:
        if loader._is_file(target):
            return loader._import_path(loader.resolve(target))
        return importlib.import_module(target)
    except Exception:  # noqa: BLE001 - fall back to the module holding the machine
        pass
    for module in list(sys.modules.values()):
        if getattr(module, "machine", None) is machine:
            return module
    for module in list(sys.modules.values()):
        if any(v is machine for v in list(vars(module).values())):
            return module
    return None


def cases_of(ref: str, machine: Any) -> list[dict[str, Any]]:
    """The cases of the module ``ref`` that defines ``machine`` (``CASES``, else a sibling
    ``*_cases.jsonl``), checked.  ``InvalidInput`` (one line) when there are none or one is
    malformed."""
    module = _module_of(ref, machine)
    cases = getattr(module, "CASES", None)
    if cases is None:
        where = Path(getattr(module, "__file__", "") or ref)
        sibling = where.with_name(where.stem + "_cases.jsonl")
        if not sibling.is_file():
            raise InvalidInput(f"machine module {ref}: no CASES list and no {sibling.name} "
                               "beside it")
        cases = _read_jsonl(sibling)
    if not isinstance(cases, list) or not cases:
        raise InvalidInput(f"machine module {ref}: CASES must be a non-empty list of objects")
    for i, case in enumerate(cases):
        _check(case, f"case #{i}")
    return cases


def _read_jsonl(path: Path) -> list[Any]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            out.append(json_input.parse(line, f"{path.name} line {n}"))
    return out


def _check(case: Any, where: str) -> None:
    """``InvalidInput`` naming ``where`` and every problem of ``case``, in one line."""
    if not isinstance(case, dict):
        raise InvalidInput(f"{where}: a case is an object, not {type(case).__name__}")
    unknown = sorted(set(case) - _KEYS)
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    shapes = (("input", dict, "'input' must be an object"),
              ("replies", list, "'replies' must be a list of script lines"),
              ("decisions", list, "'decisions' must be a list"),
              ("results", dict, "'results' is an object of lists"),
              ("stub", list, "'stub' is a list of states"),
              ("tool_results", dict, "'tool_results' is an object of lists"),
              ("branch_results", list, "'branch_results' is a list of objects"))
    found = [why for key, kind, why in shapes if key in case and not isinstance(case[key], kind)]
    version = case.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or version < 1):
        found.append("'version' must be an int >= 1")
    found += _check_replies(case)
    decisions = case.get("decisions")
    if isinstance(decisions, list) and not all(map(_decision, decisions)):
        found.append("a decision is \"timeout\" or an object with a 'choice' (or 'send', "
                     "'rerun', 'advance')")
    found += _check_numbers(case) + case_starts.problems(case)
    if found:
        raise InvalidInput(f"{where}: " + "; ".join(found))


def _decision(d: Any) -> bool:
    """True for a decision's shape (``"timeout"``, or an object saying what it does)."""
    return d == "timeout" or (isinstance(d, dict) and (d.get("timeout") is True or any(
        isinstance(d.get(k), str) for k in ("choice", "send", "rerun"))
        or _seconds(d.get("advance"))))


def _check_numbers(case: dict[str, Any]) -> list[str]:
    """The faults of the case's start numbers: ``priority`` an int, the others numbers > 0."""
    out = []
    priority = case.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        out.append("'priority' must be an int")
    for key in ("deadline_s", "token_budget", "delay_s"):
        value = case.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or value <= 0):
            out.append(f"{key!r} must be a number > 0")
    return out


def _check_replies(case: dict[str, Any]) -> list[str]:
    """The fault of the case's script lines as the scripted provider finds it (``[]``)."""
    if isinstance(case.get("replies"), list) and case["replies"]:
        from ..llm.scripted import Scripted
        try:
            Scripted.from_replies(case["replies"])
        except InvalidInput as exc:
            return [str(exc)]
    return []


def _moves(history: Sequence[Any]) -> list[list[str]]:
    from ..store.records import NOT_MOVES
    return [[h.source, h.trigger, h.dest] for h in history if h.kind not in NOT_MOVES]


def _fmt(move: Sequence[str]) -> str:
    return f"{move[0]} --{move[1]}--> {move[2]}"


def first_divergence(want: Sequence[Sequence[str]], got: Sequence[Sequence[str]]) -> str | None:
    """A line naming the first transition where ``got`` leaves ``want`` (None: the same)."""
    for i, (w, g) in enumerate(zip(want, got, strict=False), 1):
        if list(w) != list(g):
            return f"transition {i}: recorded {_fmt(w)}, now {_fmt(g)}"
    if len(want) > len(got):
        return f"transition {len(got) + 1}: recorded {_fmt(want[len(got)])}, now the run stops"
    if len(got) > len(want):
        return f"transition {len(want) + 1}: recorded the end, now {_fmt(got[len(want)])}"
    return None


def _problems(case: Mapping[str, Any], got: CaseResult) -> list[str]:
    out = []
    if "moves" in case:
        diverged = first_divergence(case["moves"], got.moves)
        if diverged:
            out.append(diverged)
    if "path" in case and list(case["path"]) != got.path:
        out.append(f"path: expected {' -> '.join(case['path'])}, got {' -> '.join(got.path)}")
    for key, have in (("final", got.state), ("status", got.status)):
        if key in case and case[key] != have:
            out.append(f"{key}: expected {case[key]!r}, got {have!r}")
    for name, want in (case.get("output") or {}).items():
        have = got.context.get(name, "(absent)")
        if have != want:
            out.append(f"output {name}: expected {want!r}, got {have!r}")
    return out


def _family(engine: Any, iid: str) -> list[Any]:
    """The records of ``iid`` and its fan-out descendants, parents first."""
    out, todo = [], [engine.store.get(iid)]
    while todo:
        one = todo.pop(0)
        out.append(one)
        todo += engine.store.children(one.id)
    return out


def _pick(engine: Any, iid: str, decisions: list[Any]) -> tuple[Any, int] | None:
    """The open review item the next decision decides and that decision's index: the
    head decision (no ``input``) for the case instance's open item; else the first
    decision naming the ``input`` (and ``state``) of a descendant whose item is open (a
    parent's own review after its join waits for its children's)."""
    from ..runtime.kinds.reviews import stale
    open_items = [(item, one) for one in _family(engine, iid)
                  for item in engine.reviews(instance_id=one.id) if stale(item, one) is None]
    head = decisions[0] if decisions else None
    own = [item for item, one in open_items if one.id == iid]
    if isinstance(head, dict) and "choice" in head and "input" not in head and own:
        return own[0], 0
    for n, d in enumerate(decisions):
        if not (isinstance(d, dict) and "choice" in d and "input" in d):
            continue
        for item, one in open_items:
            if one.id != iid and one.input == d["input"] \
                    and d.get("state", item.state) == item.state:
                return item, n
    return None


async def _operate(engine: Any, iid: str, rec: Any, decisions: list[Any]) -> bool:
    """Do the next recorded operator move or decision that applies to ``rec`` now; False
    when none does."""
    head = decisions[0] if decisions else None
    if isinstance(head, dict) and "rerun" in head:
        if not rec.final:
            return False
        decisions.pop(0)
        engine.rerun(iid, str(head["rerun"]), in_place=True, by=head.get("by"))
        return True
    if rec.final or rec.status != "waiting":
        return False
    if isinstance(head, dict) and "send" in head:
        decisions.pop(0)
        await engine.signal(iid, str(head["send"]), dict(head.get("update") or {}),
                            operator=head.get("by"))
        return True
    picked = _pick(engine, iid, decisions)
    if picked is None:
        return False
    item, n = picked
    d = decisions.pop(n)
    engine.decide(item, d["choice"], by=d.get("by", "case"), update=d.get("update"),
                  note=d.get("note"))
    return True


async def _child_timer(engine: Any, iid: str, decisions: list[Any], vc: VirtualClock) -> bool:
    """Let the SLA timer of the descendant a ``{"timeout": true, "input"}`` decision names
    decide (the clock advanced to it, that child run); False when none waits on one."""
    for n, d in enumerate(decisions):
        if not (isinstance(d, dict) and d.get("timeout") is True):
            continue
        for one in _family(engine, iid)[1:]:
            if one.status == "waiting" and one.next_attempt_at is not None \
                    and one.input == d.get("input"):
                decisions.pop(n)
                vc.advance(max(0.0, one.next_attempt_at - vc.now()) + 0.001)
                await engine.run(one.id)
                return True
    return False


def _seconds(value: Any) -> bool:
    """True for an ``advance`` decision's amount: a number of seconds ≥ 0 (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


async def _advance(engine: Any, iid: str, seconds: float, vc: VirtualClock) -> Any:
    """Move the clock ``seconds`` on, firing the case instance's timers (timer edges, a
    review's SLA, a retry's backoff) falling due meanwhile at their times, in order."""
    until = vc.now() + max(0.0, seconds)
    rec = engine.store.get(iid)
    while not rec.final and rec.next_attempt_at is not None and rec.next_attempt_at <= until:
        vc.advance(max(0.0, rec.next_attempt_at - vc.now()))
        rec = await engine.run(iid)
    vc.advance(max(0.0, until - vc.now()))
    return rec


async def _drive(engine: Any, iid: str, decisions: list[Any], vc: VirtualClock) -> Any:
    rec = await engine.run(iid)
    for _ in range(1000):  # a bound: a review loop that never ends is the case's fault
        head = decisions[0] if decisions else None
        if isinstance(head, dict) and _seconds(head.get("advance")):
            decisions.pop(0)
            rec = await _advance(engine, iid, float(head["advance"]), vc)
            continue
        if await _operate(engine, iid, rec, decisions) or (
                rec.status == "waiting" and await _child_timer(engine, iid, decisions, vc)):
            rec = engine.store.get(iid)
        elif not rec.final and rec.status == "waiting" and rec.next_attempt_at is not None:
            if decisions and decisions[0] == "timeout":  # else a retry or rate wait ends
                decisions.pop(0)
            vc.advance(max(0.0, rec.next_attempt_at - vc.now()) + 0.001)  # one renewal
        else:
            return rec
        if not rec.final:
            rec = await engine.run(iid)
    return rec


def _upcast_input(machine: Any, case: Mapping[str, Any]) -> dict[str, Any]:
    """The case's input, passed through ``machine.migrations`` after its ``version``."""
    data = dict(case.get("input") or {})
    since = case.get("version")
    if isinstance(since, int) and not isinstance(since, bool):
        for k in range(since + 1, machine.version + 1):
            fn = machine.migrations.get(k)
            if fn is not None:
                data = dict(fn(dict(data)))
    return data


def run_case(machine: Any, case: Mapping[str, Any], store: str) -> CaseResult:
    """Run ``case`` through ``machine`` in ``store`` on a fresh virtual clock: its instance
    (or each one its starts made, ``case_starts``), every expectation checked on each."""
    from ..llm.scripted import Scripted
    from .case_stubs import Inputs, stubbed
    replayed: list[str] = []  # what a replayed tool call found different
    inputs = Inputs()
    machine = stubbed(machine, case, replayed, inputs)
    vc = VirtualClock()
    engine = vc.engine(store, llm=Scripted.from_replies(list(case.get("replies") or _NO_MODEL)),
                       breaker=None)
    inputs.store = engine.store

    def drive(iid: str) -> Any:
        return vc.run(_drive(engine, iid, list(case.get("decisions") or ()), vc))
    try:
        runs, started = case_starts.run(engine, machine, case, vc,
                                        lambda c: _upcast_input(machine, c), drive)
        got = [_outcome(engine, machine, case, run) for run in runs]
    finally:
        engine.close()
    first = got[0] if got else CaseResult(str(case.get("name", "case")), [], [], "", "", {})
    first.problems = replayed + started + [p for one in got for p in one.problems]
    return first


def _outcome(engine: Any, machine: Any, case: Mapping[str, Any],
             run: case_starts.Run) -> CaseResult:
    """One instance's run as a ``CaseResult``, its problems labelled with ``run``'s label."""
    label, iid, rec = run
    moves = _moves(engine.store.history(iid))
    got = CaseResult(str(case.get("name", iid)), [machine.initial, *(m[2] for m in moves)],
                     moves, rec.state, rec.status, dict(rec.context))
    found = _problems(case, got)
    if found and rec.last_error:
        found.append(f"its last error: {rec.last_error}")
    got.problems = [f"{label}: {p}" if label else p for p in found]
    return got


def run_cases(machine: Any, cases: Sequence[Mapping[str, Any]]) -> tuple[list[CaseResult], Any]:
    """Run every case in one throwaway store; return the results and their coverage."""
    from ..coverage import from_store
    from ..store import open_store
    with tempfile.TemporaryDirectory(prefix="fsm-cases-") as tmp, _sink_in(tmp):
        path = str(Path(tmp) / "cases.db")
        results = [run_case(machine, case, path) for case in cases]
        store = open_store(path)
        try:
            return results, from_store(store, machine.export())
        finally:
            store.close()


@contextlib.contextmanager
def _sink_in(folder: str) -> Iterator[None]:
    """The built-in sink (``fsm_engine.sinks.deliver``) writing into ``folder`` while the
    cases run: a case's side effects never reach a configured webhook or file."""
    saved = {k: os.environ.get(k) for k in ("FSM_NOTIFY_URL", "FSM_NOTIFY_FILE")}
    os.environ.pop("FSM_NOTIFY_URL", None)
    os.environ["FSM_NOTIFY_FILE"] = str(Path(folder) / "notifications.jsonl")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def assert_case(module: str, case: Mapping[str, Any]) -> CaseResult:
    """Run ``case`` through the machine of ``module`` (``load_machine``'s reference);
    raise ``AssertionError`` listing what differs, the first divergent transition first."""
    from ..runtime import load_machine
    machine, _ = load_machine(module)
    with tempfile.TemporaryDirectory(prefix="fsm-case-") as tmp, _sink_in(tmp):
        got = run_case(machine, case, str(Path(tmp) / "case.db"))
    if got.problems:
        raise AssertionError(f"case {got.name} of {module}:\n  " + "\n  ".join(got.problems))
    return got
