"""The kinds of step of the intersection matrix: how a cell sets one up, which process
makes its commit, and where that commit's crash points are.

A kind's ``setup(lab, n)`` brings ``n`` instances to where the step is next (in this
process, through the API); ``op(lab, crash)`` starts the processes that make the step
— ``crash`` (an ``FSM_CRASH_AT`` value) given to the first — and returns them; ``todo``
(the CLI kinds) says whether the step is still to be made after a fault (the operator
runs the command again). A worker kind's step is made by ``fsm worker`` itself.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from matrix_harness import MODULE, ROOT, Lab, Point, until

Procs = list[subprocess.Popen[bytes]]
Ref = str


def ref(name: str) -> Ref:
    return f"{ROOT / MODULE}:{name}"


def _started(lab: Lab, name: str, n: int, run: bool) -> list[str]:
    from fsm_engine.llm import Scripted
    engine = lab.engine(Scripted(lab.script) if name.startswith("agent") else None)
    try:
        data: list[dict[str, Any]]
        if name.startswith("fan"):
            data = [{"items": [f"p{i}-{j}" for j in range(2)]} for i in range(n)]
        else:
            data = [{"item": f"{name}{i}"} for i in range(n)]
        ids = engine.start_many(ref(name), data, enqueue=not run)
        if run:
            asyncio.run(engine.run_many(ids))
        return ids
    finally:
        engine.close()


def _worker_op(lab: Lab, crash: str | None) -> Procs:
    return [lab.worker(crash)]


def _each(lab: Lab, crash: str | None, argvs: list[list[str]]) -> Procs:
    """One CLI process per argv, in turn; ``crash`` for the first."""
    procs = [lab.fsm(*argvs[0], crash=crash)] if argvs else []
    if procs and crash is None:
        procs[0].wait(60)
    for argv in argvs[1:]:
        if procs[0].poll() is None:
            return procs  # the first stopped at its crash point: the rest come later
        procs.append(lab.fsm(*argv))
        procs[-1].wait(60)
    return procs


@dataclass
class Kind:
    """One kind of step (see the module docstring)."""

    name: str
    setup: Callable[[Lab, int], list[str]]
    op: Callable[[Lab, str | None], Procs]
    #: Its commit points: the default cells' first ``default_points``, the full matrix's all.
    points: list[Point]
    todo: Callable[[Lab], bool] = lambda lab: False
    keys_per_item: int = 1
    by_worker: bool = field(default=False)
    #: Seconds a worker gets to end every instance after the fault.
    settle: float = 60.0
    #: One faulted process makes the step for several instances (a worker, ``migrate``).
    many_per_process: bool = False
    #: Instances per cell by default (None: the matrix's default; FSM_MATRIX_FULL: 4).
    n: int | None = None
    #: The default run's cells of this kind, as (fault, before/after, backend) (None:
    #: every cell the default points give; FSM_MATRIX_FULL runs them all).
    default_cells: frozenset[tuple[str, str, str]] | None = None
    #: A worker kind whose faulted worker holds instances at its crash point (a SIGKILL
    #: before it is followed by a takeover); False: it holds none (a schedule tick).
    holds: bool = True
    #: What the kind itself asserts after the cell (one line per problem; ``[]``: holds),
    #: and when its work is all there (``_finish`` waits for it beside every instance
    #: ending).
    problems: Callable[[Lab], list[str]] = lambda lab: []
    #: How many of ``points`` the default run faults: a SIGKILL at each, a SIGSTOP and a
    #: restart before the first of each label (two commits a step makes: the first 4).
    default_points: int = 2


# -- plain action, fan-out child, join: steps a worker makes -------------------------------
def _enqueue(name: str) -> Callable[[Lab, int], list[str]]:
    return lambda lab, n: _started(lab, name, n, run=False)


def _in_review(lab: Lab, n: int) -> list[str]:
    """``n`` parents of ``fan_review``, run by a worker until every child waits in review."""
    ids = _started(lab, "fan_review", n, run=False)
    worker = lab.worker()
    until(lambda: len(_open_items(lab)) == 2 * n, "every child to wait in review", 30)
    assert lab.stop(worker) == 0, lab.output(worker)
    return ids


def _open_items(lab: Lab) -> list[str]:
    engine = lab.engine()
    try:
        return [item.id for item in engine.reviews()]
    finally:
        engine.close()


def _waiting(lab: Lab, state: str) -> list[str]:
    return [r.id for r in lab.records() if r.status == "waiting" and r.state == state]


def _decide(lab: Lab, crash: str | None, choice: str = "approve") -> Procs:
    return _each(lab, crash, [["review", "decide", i, choice, "--as", "bob"]
                              for i in _open_items(lab)])


def _reject(lab: Lab, crash: str | None) -> Procs:
    """A decision that ends the child (``reject`` -> ``rejected``, final)."""
    return _decide(lab, crash, "reject")


def _send(lab: Lab, crash: str | None) -> Procs:
    procs: Procs = []
    for iid in _waiting(lab, "wait"):
        procs.append(lab.send(iid, crash if not procs else None))
        if procs[0].poll() is None and len(procs) == 1 and crash:
            return procs
        procs[-1].wait(60)
    return procs


def _not_rerun(lab: Lab) -> list[str]:
    store_records = lab.records()
    engine = lab.engine()
    try:
        return [r.id for r in store_records
                if not any(h.kind == "rerun" for h in engine.store.history(r.id))]
    finally:
        engine.close()


def _rerun(lab: Lab, crash: str | None) -> Procs:
    return _each(lab, crash, [["rerun", i, "--state", "work", "--in-place"]
                              for i in _not_rerun(lab)])


def _unforked(lab: Lab) -> list[str]:
    records = lab.records()
    forked = {r.forked_from for r in records}
    return [r.id for r in records if not r.forked_from and r.id not in forked]


def _fork(lab: Lab, crash: str | None) -> Procs:
    return _each(lab, crash, [["fork", i, "--from-state", "work"] for i in _unforked(lab)])


def _fork_approval(lab: Lab, crash: str | None) -> Procs:
    """``fsm fork ID --from-state research`` of each agent waiting on a call's approval
    (``crash`` for the first), then ``fsm review decide`` of every item open: once every
    fork is made, after a worker stepped each one to its own item (``_finish`` runs one)."""
    todo = _unforked(lab)
    if not todo:
        until(lambda: not _forks_to_step(lab), "every fork to wait on its own item", 30)
    return _each(lab, crash, [*(["fork", i, "--from-state", "research"] for i in todo),
                              *(["review", "decide", i, "approve", "--as", "bob"]
                                for i in _open_items(lab))])


def _forks_to_step(lab: Lab) -> list[str]:
    """Forks still on their way to their own item (pending or running: a fork from the
    start of ``research`` runs its turns again before it asks; one stepped only once was
    taken for waiting, its item was not open yet when the others were decided, and nobody
    decided it: the harness's own race, found under load)."""
    return [r.id for r in lab.records() if r.forked_from and r.status in ("pending", "running")]


def _migrate(lab: Lab, crash: str | None) -> Procs:
    return [lab.fsm("migrate", "--yes", "--batch", "1", crash=crash, MATRIX_VERSION="2")]


def _unmigrated(lab: Lab) -> bool:
    return any(r.machine_version == 1 and r.status != "completed" for r in lab.records())


# -- a delayed start (issue 38): scheduled until due, then claimed by a worker --------------
def _delayed(lab: Lab, n: int) -> list[str]:
    """``n`` instances of ``flow`` started 2 s from now (status ``scheduled``), each with a
    start key; none claimable before it is due."""
    engine = lab.engine()
    try:
        ids = [engine.start(ref("flow"), {"item": f"delayed{i}"}, delay=2.0, key=f"delayed{i}")
               for i in range(n)]
        assert {engine.store.get(i).status for i in ids} == {"scheduled"}
        return ids
    finally:
        engine.close()


# -- timers (issue 38): a fire once due, an initial state's, a fork's ----------------------
def _forked_waiting(lab: Lab, n: int) -> list[str]:
    """``n`` instances of ``timed`` waiting on their timer (armed here), each forked from
    ``wait`` while it waits (``Engine.fork``: the fork unowned, not yet stepped); then the
    originals fire here once due, so every commit a worker makes is a fork's, and each
    fork's first step comes after its original's due time (a due time inherited would
    fire at once)."""
    import time
    ids = _started(lab, "timed", n, run=True)
    engine = lab.engine()
    try:
        forks = [engine.fork(i, from_state="wait") for i in ids]
        due = max(engine.store.get(i).next_attempt_at or 0.0 for i in ids)
        time.sleep(max(0.0, due - time.time()) + 0.05)
        ended = asyncio.run(engine.run_many(ids))
        assert [getattr(r, "status", r) for r in ended] == ["completed"] * n, ended
        return forks
    finally:
        engine.close()


#: Seconds two recorded times may differ by (PostgreSQL keeps ``at`` to the microsecond).
_EPS = 1e-3


def _timer_problems(lab: Lab) -> list[str]:
    """Each instance's timer (``late`` out of ``wait``) fired once, at the due time
    recorded by the one row of its own that armed it, that row's time plus ``after``,
    and not before it (``fired_once``); a fork's due time later than its original's
    (a fresh ``after`` from its first step, not the time the original had left)."""
    from fsm_engine.definition.timers import constant_s
    engine = lab.engine()
    try:
        out: list[str] = []
        dues: dict[str, float | None] = {}
        records = engine.store.list()
        for rec in records:
            [(_, after)] = engine.definition(rec).timers["wait"]
            found, dues[rec.id] = fired_once(rec, engine.store.history(rec.id),
                                              constant_s(after) or 0.0)
            out += found
    finally:
        engine.close()
    for rec in records:
        mine, theirs = dues[rec.id], dues.get(rec.forked_from or "")
        if rec.forked_from and mine is not None and theirs is not None and mine <= theirs:
            out.append(f"{rec.id}: due at {mine}, not after its original's {theirs}")
    return out


def fired_once(rec: Any, rows: list[Any], after: float) -> tuple[list[str], float | None]:
    """What is wrong with ``rec``'s timer (its history ``rows``, a delay of ``after`` s),
    and its due time.  The row arming it is the entering one (``detail.timers``), or, where
    no row of its own entered ``wait`` (an initial state, a fork: its rows up to
    ``forked_at_seq`` are the original's), an in-place ``armed`` one."""
    own = [h for h in rows if h.seq > (rec.forked_at_seq or 0)]
    arming = [h for h in own if isinstance(h.detail.get("timers"), dict)]
    fired = [h for h in own if h.kind == "timer"]
    want = "armed" if rec.forked_from or rec.machine == "timed_first" else "transition"
    if [h.kind for h in arming] != [want] or len(fired) != 1:
        return [f"{rec.id}: timer armed by {[(h.seq, h.kind) for h in arming]} (expected one "
                f"{want} row), fired by {[h.seq for h in fired]} (expected one)"], None
    due, at = arming[0].detail["timers"].get("late"), fired[0].detail["timer"]["due"]
    if not isinstance(due, (int, float)) or abs(due - (arming[0].at + after)) > _EPS:
        return [f"{rec.id}: due {due}, armed at {arming[0].at} + {after} s"], None
    out = [f"{rec.id}: fired for due {at}, its row armed it for {due}"] \
        if abs(at - due) > _EPS else []
    if fired[0].at < due - _EPS:
        out.append(f"{rec.id}: fired at {fired[0].at}, before its due {due}")
    return out, due


# -- a schedule tick (issue 38): a worker fires it, one instance per tick --------------------
TICKS = "tick"


def _scheduled(lab: Lab, n: int) -> list[str]:
    """A schedule of ``flow`` ticking ``n`` times, one second apart, from 3 s on (a cron of
    those seconds: then not again for a year), every tick started (``catchup=all``,
    ``overlap=allow``); no instance yet."""
    import math
    import time
    from datetime import UTC, datetime
    first = math.ceil(time.time()) + 3
    if first % 60 + n > 60:  # the n seconds within one minute
        first += 60 - first % 60
    at = datetime.fromtimestamp(first, UTC)
    cron = (f"{','.join(str(at.second + i) for i in range(n))} {at.minute} {at.hour} "
            f"{at.day} {at.month} *")
    engine = lab.engine()
    try:
        engine.schedules.add(TICKS, ref("flow"), cron=cron, input={"item": TICKS},
                             catchup="all", overlap="allow")
    finally:
        engine.close()
    return []


def _tick_problems(lab: Lab) -> list[str]:
    """Each of the schedule's ticks has exactly one instance (its id and start key name the
    tick), and the schedule advanced past them all."""
    from fsm_engine.runtime.schedule_spec import tick_id, tick_key, ticks
    engine = lab.engine()
    try:
        row = engine.store.get_schedule(TICKS)
        assert row is not None
        first = row.created_at
        want = [tick_id(TICKS, t) for t in ticks(row, first, first + 120, 100)]
        records = engine.store.list()
    finally:
        engine.close()
    have = sorted(r.id for r in records)
    out = [] if have == want else [f"{TICKS}: tick instances {have}, expected {want}"]
    out += [f"{r.id}: start key {r.start_key!r}" for r in records
            if r.id in want and r.start_key != tick_key(TICKS, _tick_of(r.id))]
    if row.last_instance != (want[-1] if want else None):
        out.append(f"{TICKS}: last instance {row.last_instance}, expected {want[-1:]}")
    return out


def _tick_of(iid: str) -> float:
    from fsm_engine.runtime.schedule_spec import parse_tick_id
    found = parse_tick_id(iid)
    assert found is not None
    return found[1]


def _commit(when: str, label: str, n: int = 1) -> Point:
    return Point("commit", when, label, n)


def _both(label: str, method: str = "commit", n: int = 1) -> list[Point]:
    return [Point(method, "before", label, n), Point(method, "after", label, n)]


KINDS = {k.name: k for k in [
    Kind("plain", _enqueue("flow"), _worker_op,
         [*_both("src=work"), *_both("outbox_begins", "outbox_begins"), *_both("outbox")],
         by_worker=True, many_per_process=True),
    Kind("child", _enqueue("fan"), _worker_op,
         [*_both("child"), *_both("create"), *_both("wake")], by_worker=True,
         many_per_process=True),
    Kind("join", _enqueue("fan"), _worker_op, _both("join"), by_worker=True,
         many_per_process=True, n=1),
    Kind("review", lambda lab, n: _started(lab, "reviewed", n, run=True), _decide,
         _both("review"), todo=lambda lab: bool(_open_items(lab))),
    Kind("child-review", _in_review, _reject, _both("review"),
         todo=lambda lab: bool(_open_items(lab)), settle=5.0, n=1),
    Kind("budget", _enqueue("budgeted"), _worker_op, _both("src=work"), by_worker=True),
    Kind("send", lambda lab, n: _started(lab, "signal", n, run=True), _send,
         _both("src=wait"), todo=lambda lab: bool(_waiting(lab, "wait"))),
    # a timer edge's fire (issue 38): instances wait in ``wait`` (armed in this process),
    # a worker claims each once due and commits the fire (row kind ``timer``)
    Kind("timer", lambda lab, n: _started(lab, "timed", n, run=True), _worker_op,
         _both("timer"), by_worker=True, many_per_process=True, problems=_timer_problems),
    # an initial state's timer (issue 38): no row enters it, a worker's first step arms it
    # (an in-place ``armed`` row), the fire once due reads that row's time back: both
    # commits faulted, the armed row's and the fire's
    Kind("timer-initial", _enqueue("timed_first"), _worker_op,
         [*_both("armed"), *_both("timer")], by_worker=True, many_per_process=True,
         problems=_timer_problems, default_points=4),
    # a fork of an instance waiting on a timer (issue 38): its first step arms a fresh
    # ``after`` (``armed``), never the original's due time; both commits faulted
    Kind("fork-timer", _forked_waiting, _worker_op, [*_both("armed"), *_both("timer")],
         by_worker=True, many_per_process=True, problems=_timer_problems, default_points=4),
    # a delayed start (issue 38): a worker claims each once due (just after the claim's
    # commit: the claimed instance is left to a takeover; before it nothing is held, so
    # there is no cell), then steps it
    Kind("delayed", _delayed, _worker_op, [Point("claim", "after", "claim"), *_both("src=work")],
         by_worker=True, many_per_process=True),
    Kind("rerun", lambda lab, n: _started(lab, "flow", n, run=True), _rerun,
         _both("rerun"), todo=lambda lab: bool(_not_rerun(lab)), keys_per_item=2),
    Kind("fork", lambda lab, n: _started(lab, "flow", n, run=True), _fork,
         [Point("create", "before", "fork"), Point("create", "after", "fork")],
         todo=lambda lab: bool(_unforked(lab))),
    Kind("migration", _enqueue("flow"), _migrate, _both("migration"), todo=_unmigrated,
         many_per_process=True),
    # an agent loop a worker steps: the side effect's result commit (default cells), then
    # a turn's, the plain tool's and the outbox row's (the final transition is a plain
    # step's; its 2nd "final" commit may hold no instance left to take over)
    Kind("agent-call", _enqueue("agent_loop"), _worker_op,
         [*_both("outbox"), *_both("agent=turn"), *_both("agent=call"),
          *_both("outbox_begins", "outbox_begins")],
         by_worker=True, many_per_process=True),
    # a person's approval of an agent's side-effect call (``fsm review decide``)
    Kind("agent-approval", lambda lab, n: _started(lab, "agent_approve", n, run=True),
         _decide, _both("agent=decision"), todo=lambda lab: bool(_open_items(lab))),
    # a fork of an agent waiting on a call's approval (``fsm fork``; issue 36): the fork
    # waits on an item of its own, both are approved; a call delivered once per instance
    Kind("fork-approval", lambda lab, n: _started(lab, "agent_approve", n, run=True),
         _fork_approval, [Point("create", "before", "fork"), Point("create", "after", "fork")],
         todo=lambda lab: bool(_unforked(lab) or _open_items(lab) or _forks_to_step(lab)),
         keys_per_item=2, n=1),
    # an agent whose turns stream several batches long (issue 36): mid-turn (around the 2nd
    # batch carrying text), after the batch opening it, then the turn's commit
    Kind("agent-stream", _enqueue("agent_stream"), _worker_op,
         [*_both("chunk", "stream_write", 2), Point("stream_write", "after", "open"),
          *_both("agent=turn")], by_worker=True, many_per_process=True,
         default_cells=frozenset({("kill", "before", "sqlite"), ("kill", "after", "postgres"),
                                  ("stop", "before", "postgres")})),
    # a streamed model call that ends within FLUSH_S: its rows ride the step's commit, or
    # its history holds them (stream_inline)
    Kind("stream-short", _enqueue("stream_short"), _worker_op, _both("src=work"),
         by_worker=True, many_per_process=True,
         default_cells=frozenset({("kill", "before", "sqlite"), ("stop", "before", "postgres")})),
    # one several batches long: mid-stream (around the 2nd batch carrying text: the first
    # written, the call not ended), after the batch that opens it, then the step's commit
    Kind("stream-long", _enqueue("stream_long"), _worker_op,
         [*_both("chunk", "stream_write", 2), Point("stream_write", "after", "open"),
          *_both("src=work")], by_worker=True, many_per_process=True,
         default_cells=frozenset({("kill", "after", "sqlite"), ("kill", "after", "postgres"),
                                  ("stop", "before", "postgres"),
                                  ("pg_restart", "before", "postgres")})),
    # a schedule tick a worker fires (issue 38): the tick's instance created, before or
    # after its commit; one instance per tick whoever fires it next (its id and start key)
    Kind("schedule-tick", _scheduled, _worker_op, _both("start", "create"), by_worker=True,
         holds=False, problems=_tick_problems, keys_per_item=4, many_per_process=True),
]}
