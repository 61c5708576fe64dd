"""How a case starts its instances (``cases``): once, once per key, a debounced burst, or
the ticks of a schedule (issue 38, item 8).

Case keys (beside ``cases``'s own), checked by ``problems`` before any case runs:

* ``key`` (str, 1-200 characters): the case instance is started with that idempotent
  start key (``Engine.start(key=...)``), then started again with the same key and input
  at once and once more after its run: both repeats must return the case's instance and
  start nothing.  Give each case of a module its own key (the cases share one store: a key
  an earlier case holds is reported as a problem).
* ``debounce``: ``{"key": K, "window_s": S, "max_wait_s": M, "inputs": [{...}, ...]}``
  (``max_wait_s`` optional, not under ``window_s``; ``inputs`` 1-100 objects, in place of
  the case's ``input``): one start per input, in a burst at the same virtual instant, with
  ``Engine.start(debounce_key=K, debounce=S, max_wait=M)``.  They must collapse into one
  instance whose input is the last one's (its fields); that instance then runs to its end.
* ``schedule``: ``{"every": "10s"}`` or ``{"cron": "*/5 * * * * *", "tz": "UTC"}``, with
  ``"ticks": N`` (1-100, default 1) and ``"overlap"`` / ``"catchup"`` as ``fsm schedule
  add`` takes them (``runtime.schedules``).  The case adds that schedule of its machine
  (``Engine.schedules.add``, the case's ``input`` as the schedule's input) under a name
  made from the case's name (``schedule_spec.check_name``), then moves the virtual clock
  to each of its next ``N`` ticks, where ``VirtualClock.advance`` fires them
  (``Schedules.fire_due``, what ``fsm worker`` calls), and runs each tick's instance to
  its end (the case's ``decisions`` for each, afresh; ``replies`` serve them in turn).
  Ticks that fall due while an instance runs (its decisions move the clock on) fire then,
  as ``overlap`` says; the schedule is paused as soon as its ``N``-th tick fired.
  Each tick must have made exactly one instance, found by its start key
  (``schedule_spec.tick_key``: ``schedule:NAME:ISO-TIME``) under its tick id; the
  schedule is deleted after the case.  It takes no ``key``, ``debounce``, ``delay_s``,
  ``deadline_s``, ``token_budget`` or ``priority`` (a tick starts as a worker starts it).
* ``instances`` (an int >= 0, an expectation): how many instances the case's starts made
  (a schedule's: its ticks' that started one; default: one per tick, else one).

Errors: ``problems`` lists each fault of these keys (``cases`` joins them into one
``InvalidInput`` line); ``run`` returns the problems of the starts themselves (a repeat
that made another instance, a burst that did not collapse, a tick with no instance).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import InvalidInput, StartConflict
from ..runtime import schedule_spec as spec
from ..runtime.schedule_fire import exists

__all__ = ["KEYS", "TICKS_MAX", "problems", "run"]

#: The case keys this module reads.
KEYS = frozenset({"schedule", "key", "debounce", "instances"})
#: Most ticks (and most debounced inputs) one case takes.
TICKS_MAX = 100
_SCHEDULE = {"every", "cron", "tz", "ticks", "overlap", "catchup"}
_DEBOUNCE = {"key", "window_s", "max_wait_s", "inputs"}
_NOT_WITH_SCHEDULE = ("key", "debounce", "delay_s", "deadline_s", "token_budget", "priority")

#: One instance a case ran: ``(label for its problems, id, its last record)``.
Run = tuple[str, str, Any]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _count(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _key_text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 200


def _fault(check: Callable[[], Any]) -> list[str]:
    """The one-line message of the ``InvalidInput`` ``check()`` raises (``[]``: none), a
    flag it names (``--cron``) named as the schedule's field."""
    try:
        check()
    except InvalidInput as exc:
        return [re.sub(r"^--", "'schedule' ", str(exc))]
    return []


def _schedule_problems(s: Any, case: Mapping[str, Any]) -> list[str]:
    """Every fault of a case's ``schedule`` object."""
    if not isinstance(s, dict):
        return ["'schedule' must be an object ({\"every\": \"10s\"} or {\"cron\": EXPR})"]
    out = [f"'schedule' has unknown key(s) {sorted(set(s) - _SCHEDULE)}; allowed: "
           f"{sorted(_SCHEDULE)}"] if set(s) - _SCHEDULE else []
    if ("cron" in s) == ("every" in s):
        out.append("'schedule' takes exactly one of 'cron' or 'every'")
    if "every" in s:
        out += _fault(lambda: spec.parse_every(s["every"]))
    if "cron" in s:
        out += _fault(lambda: spec.check_cron(s["cron"]))
    out += _fault(lambda: spec.zone(s.get("tz", "UTC")))
    out += _fault(lambda: spec.check_choice(s.get("overlap", "skip"), spec.OVERLAPS, "overlap"))
    out += _fault(lambda: spec.check_choice(s.get("catchup", "none"), spec.CATCHUPS, "catchup"))
    if not _count(s.get("ticks", 1), 1, TICKS_MAX):
        out.append(f"'schedule' 'ticks' must be an int from 1 to {TICKS_MAX}, not "
                   f"{s.get('ticks')!r}"[:200])
    clash = [k for k in _NOT_WITH_SCHEDULE if k in case]
    if clash:
        out.append(f"a 'schedule' case starts its ticks as a worker does: no {clash}")
    return out


def _debounce_problems(d: Any, case: Mapping[str, Any]) -> list[str]:
    """Every fault of a case's ``debounce`` object."""
    if not isinstance(d, dict):
        return ["'debounce' must be an object {\"key\", \"window_s\", \"max_wait_s\", \"inputs\"}"]
    out = [f"'debounce' has unknown key(s) {sorted(set(d) - _DEBOUNCE)}; allowed: "
           f"{sorted(_DEBOUNCE)}"] if set(d) - _DEBOUNCE else []
    if not _key_text(d.get("key")):
        out.append("'debounce' 'key' must be a string of 1 to 200 characters")
    if not _number(d.get("window_s")):
        out.append("'debounce' 'window_s' must be a number > 0")
    wait = d.get("max_wait_s")
    if wait is not None and not (_number(wait) and wait >= (d.get("window_s") or 0)):
        out.append("'debounce' 'max_wait_s' must be a number, not under 'window_s'")
    inputs = d.get("inputs")
    if not (isinstance(inputs, list) and 0 < len(inputs) <= TICKS_MAX
            and all(isinstance(i, dict) for i in inputs)):
        out.append(f"'debounce' 'inputs' must be a list of 1 to {TICKS_MAX} objects")
    clash = [k for k in ("input", "key", "delay_s") if k in case]
    if clash:
        out.append(f"a 'debounce' case gives its inputs and starts them at once: no {clash}")
    return out


def problems(case: Mapping[str, Any]) -> list[str]:
    """Every fault of ``case``'s ``key``, ``debounce``, ``schedule`` and ``instances``."""
    out = []
    if "key" in case and not _key_text(case["key"]):
        out.append("'key' must be a string of 1 to 200 characters")
    if "debounce" in case:
        out += _debounce_problems(case["debounce"], case)
    if "schedule" in case:
        out += _schedule_problems(case["schedule"], case)
    if "instances" in case and not _count(case["instances"], 0, 10**6):
        out.append("'instances' must be an int >= 0")
    return out


def run(engine: Any, machine: Any, case: Mapping[str, Any], vc: Any,
        data: Callable[[Mapping[str, Any]], dict[str, Any]],
        drive: Callable[[str], Any]) -> tuple[list[Run], list[str]]:
    """Start ``case``'s instances on ``engine`` (``vc``'s), each run by ``drive(id)`` (to
    its last record); return the runs, in start order, and the problems of the starts
    (``instances`` included).  ``data(case)``: a start input (upcast)."""
    if "schedule" in case:
        runs, out = _ticks(engine, machine, case, vc, data, drive)
    elif "debounce" in case:
        runs, out = _burst(engine, machine, case, data, drive)
    else:
        runs, out = _once(engine, machine, case, data, drive)
    want = case.get("instances")
    if want is not None and want != len(runs):
        out.append(f"instances: expected {want}, the case's starts made {len(runs)}")
    return runs, out


def _options(case: Mapping[str, Any]) -> dict[str, Any]:
    return {"deadline_s": case.get("deadline_s"), "token_budget": case.get("token_budget"),
            "priority": case.get("priority", 0)}


def _once(engine: Any, machine: Any, case: Mapping[str, Any], data: Callable[..., Any],
          drive: Callable[[str], Any]) -> tuple[list[Run], list[str]]:
    """The case instance, started once; with ``key``, started again before and after its
    run (each repeat must return it)."""
    key, given = case.get("key"), data(case)
    opts = {**_options(case), "delay": case.get("delay_s"), "key": key}
    held = None if key is None else engine.store.by_start_key(machine.name, key)
    if held is not None:  # (its run is over: nothing of this case runs)
        return [("", held.id, held)], [f"key {key!r}: held by instance {held.id} of an "
                                       "earlier case (give each case its own key)"]
    iid = engine.start(machine, given, **opts)
    out = _repeat(engine, machine, given, opts, iid, "at once")
    rec = drive(iid)
    out += _repeat(engine, machine, given, opts, iid, "after its run")
    return [("", iid, rec)], out


def _repeat(engine: Any, machine: Any, given: dict[str, Any], opts: dict[str, Any],
            iid: str, when: str) -> list[str]:
    """A repeated start with the case's key: ``[]`` when it returned ``iid``."""
    if opts["key"] is None:
        return []
    try:
        again = engine.start(machine, given, **opts)
    except StartConflict as exc:
        return [f"key {opts['key']!r}: a repeated start {when} was refused: {exc}"]
    if again == iid:
        return []
    return [f"key {opts['key']!r}: a repeated start {when} made instance {again}, not "
            f"returned {iid}"]


def _burst(engine: Any, machine: Any, case: Mapping[str, Any], data: Callable[..., Any],
           drive: Callable[[str], Any]) -> tuple[list[Run], list[str]]:
    """The debounced starts, at one instant; then each instance they made, run."""
    d = case["debounce"]
    inputs = [data({**case, "input": one}) for one in d["inputs"]]
    ids = [engine.start(machine, one, debounce_key=d["key"], debounce=d["window_s"],
                        max_wait=d.get("max_wait_s"), **_options(case)) for one in inputs]
    made = list(dict.fromkeys(ids))
    out = []
    if len(made) != 1:
        out.append(f"debounce: {len(ids)} starts made {len(made)} instances "
                   f"({', '.join(made)}), not one")
    last = engine.store.get(ids[-1]).input
    if {k: last.get(k) for k in inputs[-1]} != inputs[-1]:
        out.append(f"debounce: instance {ids[-1]} holds input {last!r}, not the last "
                   f"start's {inputs[-1]!r}"[:400])
    labels = [f"instance {i}" if len(made) > 1 else "" for i in made]
    return [(label, i, drive(i)) for label, i in zip(labels, made, strict=True)], out


def _ticks(engine: Any, machine: Any, case: Mapping[str, Any], vc: Any,
           data: Callable[..., Any], drive: Callable[[str], Any]
           ) -> tuple[list[Run], list[str]]:
    """Add the case's schedule, fire its next ``ticks`` ticks on the virtual clock, run
    each tick's instance; then delete the schedule."""
    row, due = _add(engine, machine, case, data(case))
    runs: list[Run] = []
    out: list[str] = []
    vc.after_ticks = lambda: _stop_after(engine, row.name, due[-1])
    try:
        for n, tick in enumerate(due, 1):
            vc.advance(max(0.0, tick - vc.now()))  # fires the ticks due on the way
            label = f"tick {n} ({spec.iso(tick)})"
            held = engine.store.by_start_key(machine.name, spec.tick_key(row.name, tick))
            if held is None:
                if "instances" not in case:
                    out.append(f"{label}: started no instance (overlap {row.overlap!r}, "
                               f"catchup {row.catchup!r})")
                continue
            if held.id != spec.tick_id(row.name, tick):
                out.append(f"{label}: its instance is {held.id}, not "
                           f"{spec.tick_id(row.name, tick)}")
            runs.append((f"{label} {held.id}", held.id, drive(held.id)))
    finally:
        vc.after_ticks = None
        engine.schedules.delete(row.name)
    return runs, out


def _stop_after(engine: Any, name: str, last: float) -> None:
    """Pause schedule ``name`` once its tick ``last`` fired (its next tick is later), also
    while an instance's run moves the clock on: the case's ticks are its first ones."""
    row = engine.store.get_schedule(name)
    if row is not None and not row.paused and row.next_fire > last:
        engine.schedules.pause(name)


def _add(engine: Any, machine: Any, case: Mapping[str, Any], given: dict[str, Any]
         ) -> tuple[Any, list[float]]:
    """The case's schedule and its next ``ticks`` ticks (epoch seconds), added under a
    name from the case's name that no schedule and no tick of an earlier case in the store
    holds (the cases share one store and start at the same virtual time)."""
    s = case["schedule"]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(case.get("name") or "case"))
    slug = slug.strip("-_.")[:60] or "case"
    for n in range(1, 1000):
        name = slug if n == 1 else f"{slug}-{n}"
        if engine.store.get_schedule(name) is not None:
            continue
        row = engine.schedules.add(name, machine, cron=s.get("cron"), every=s.get("every"),
                                   tz=s.get("tz", "UTC"), input=given,
                                   overlap=s.get("overlap", "skip"),
                                   catchup=s.get("catchup", "none"))
        due = [row.next_fire]
        while len(due) < s.get("ticks", 1):
            due.append(spec.next_after(row, due[-1]))
        if not any(exists(engine, spec.tick_id(name, t)) for t in due):
            return row, due
        engine.schedules.delete(name)  # an earlier case's ticks hold the name
    raise InvalidInput(f"no free schedule name for case {slug!r}")

