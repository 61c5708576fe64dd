"""The intersection matrix: each kind of step × each fault × each backend, one checker.

Kinds (``matrix_kinds``): a plain action, a fan-out child, a join, a review decision (of
a lone instance, and of a fan-out child), a send, a timer edge's fire (``timer``), an
in-place rerun, a fork, a migration,
a plain action whose guard reads its state's token budget, an agent loop's step (a turn,
a tool call, a side effect's delivery: ``agent-call``), a person's approval of an
agent's tool call (``agent-approval``) and a step that streams its model call, one that
ends within the batcher's ``FLUSH_S`` (``stream-short``: its rows ride the step's commit),
one several batches long (``stream-long``: its crash points include the stream
writes, mid-stream), an agent whose model turns stream several batches long
(``agent-stream``, issue 36: cut mid-turn, after the turn's first batch, at its commit),
a schedule tick a worker fires (``schedule-tick``: the tick's instance created, one
per tick), an initial state's timer (``timer-initial``: armed by the first step in an
in-place ``armed`` row, then fired) and a fork of an instance waiting on a timer
(``fork-timer``: a fresh ``after`` armed at the fork's first step, then fired); each
timer kind (``timer`` too) checks its fire came once, at the due time its arming row
recorded. Faults, each at the kind's commit point (``fsm_engine.store.crash``: the
process that makes the step stops itself there):

- ``kill``: SIGKILL just before / just after the commit; a second ``fsm worker`` takes
  the dead owner's instances over (and the operator runs a killed command again);
- ``stop``: SIGSTOP just before the commit; a second ``fsm worker`` takes the stopped
  owner's instances over when its lease runs out; then the owner is let go on (SIGCONT)
  and its commit must not land over the new owner's;
- ``pg_restart`` (PostgreSQL only): SIGSTOP at the commit, ``pg_ctl restart`` of the
  cluster, SIGCONT: the owner meets a dropped connection at its commit and recovers.

Then ``matrix_check.check`` asserts the same invariants in every cell, and
``matrix_export.check`` exports every instance the cell ended (``fsm export-test``) and runs
each exported test: it passes, delivering nothing again, or the export refuses in one
known line. Default sizes
keep the matrix to a few minutes on 2 cores (2 instances, the first commit point of
each kind (of ``timer-initial`` and ``fork-timer`` the first two, the armed row's and
the fire's: ``Kind.default_points``), before/after for kills, one cell per backend for
the kinds added to show a known bug; plain ``python -m pytest`` runs each kind's first
cell, the second lane the rest); ``FSM_MATRIX_FULL=1`` runs every commit point of every kind, before and
after, at its 1st and (where one process makes several) 2nd occurrence, with 4
instances; ``FSM_MATRIX_REPEATS=N`` runs each cell N times.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import matrix_check
import matrix_export
import pytest
from matrix_harness import LEASE, NEVER_CAME, Lab, Point, ended_for, until, wait_stopped
from matrix_kinds import KINDS, Kind
from typer.testing import CliRunner

from fsm_engine import Engine
from fsm_engine.cli import app
from fsm_engine.store import FINAL_STATUSES

FULL = os.environ.get("FSM_MATRIX_FULL") == "1"
N = 4 if FULL else 2
REPEATS = int(os.environ.get("FSM_MATRIX_REPEATS", "1"))
FAULTS = ("kill", "stop", "pg_restart")

#: (kind, fault, before/after or METHOD:before/after) -> why the cell fails today (issue
#: 19's findings 1-3, the matrix's own M1-M6 and A1-A2, and the stream cells' S2 are fixed:
#: tests/integration/test_matrix_findings.py, tests/integration/test_agent_findings.py,
#: tests/runtime/fleet/test_release_after_claim.py, tests/store/test_pg_stalled_transaction.py,
#: tests/runtime/test_stream_write_failed.py; a cell found failing goes here with its reason
#: until its fix lands).
KNOWN: dict[tuple[str, str, str], str] = {}
#: Known failures that depend on timing (``strict=False``: the cell may pass).
RACY: tuple[str, ...] = ()


def _points(kind: Kind, fault: str) -> list[Point]:
    points = kind.points if FULL else kind.points[:kind.default_points]
    if fault != "kill" and not FULL:  # before each commit (label), its first occurrence
        befores = [p for p in points if p.when == "before"]
        points = [p for i, p in enumerate(befores)
                  if p.label not in {q.label for q in befores[:i]}]
    if FULL and kind.many_per_process:  # the step's next occurrence in the faulted process
        points = [*points, *(Point(p.method, p.when, p.label, p.n + 1) for p in points)]
    return points


def _cells() -> list[Any]:
    """Every cell, each marked ``slow``; each kind's first (SIGKILL at its first commit
    point, on SQLite) also ``fast``: plain ``python -m pytest`` runs one cell per kind."""
    cells = []
    for kind in KINDS.values():
        for fault in FAULTS:
            for point in _points(kind, fault):
                for backend in ("sqlite", "postgres"):
                    if fault == "pg_restart" and backend == "sqlite":
                        continue
                    if not FULL and kind.default_cells is not None and (
                            fault, point.when, backend) not in kind.default_cells:
                        continue
                    for rep in range(REPEATS):
                        fast = not any(kind.name == c.values[0] for c in cells)
                        cells.append(_cell(kind.name, fault, point, backend, rep, fast=fast))
    return cells


def _cell(kind: str, fault: str, point: Point, backend: str, rep: int, *, fast: bool = False) -> Any:
    marks = [pytest.mark.slow, *([pytest.mark.fast] if fast else [])]
    why = KNOWN.get((kind, fault, point.when)) or KNOWN.get(
        (kind, fault, f"{point.method}:{point.when}"))
    if why:
        marks.append(pytest.mark.xfail(strict=why not in RACY, reason=why))
    name = f"{kind}-{fault}-{point}-{backend}" + (f"-r{rep}" if REPEATS > 1 else "")
    return pytest.param(kind, fault, point, backend, marks=marks, id=name)


@pytest.fixture
def lab(backend_url: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    url, cluster = backend_url
    made = Lab(url, tmp_path, cluster)
    for key in ("MATRIX_LOG", "MATRIX_SINK", "FSM_MACHINES_ROOT"):
        monkeypatch.setenv(key, made.env[key])
    monkeypatch.delenv("MATRIX_VERSION", raising=False)
    _forget_module()
    yield made
    made.close()
    _forget_module()


@pytest.fixture
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    backend = request.node.callspec.params["backend"]
    if backend == "postgres":
        cluster = request.getfixturevalue("pg_cluster")
        return cluster.database(), cluster
    return str(tmp_path / "fsm.db"), None


def _forget_module() -> None:
    for name in [n for n, m in sys.modules.items()
                 if n.startswith("fsm_machine_") and "matrix_machines" in str(
                     getattr(m, "__file__", ""))]:
        del sys.modules[name]


@pytest.mark.parametrize(("kind", "fault", "point", "backend"), _cells())
def test_cell(lab: Lab, kind: str, fault: str, point: Point, backend: str,
              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = KINDS[kind]
    spec.setup(lab, N if FULL or spec.n is None else spec.n)
    if kind == "migration":  # from here on every process runs version 2
        lab.env["MATRIX_VERSION"] = "2"
        monkeypatch.setenv("MATRIX_VERSION", "2")
        _forget_module()
    try:
        FAULT_RUNNERS[fault](lab, spec, point)
    except AssertionError:  # a fault that did not play out: what each process said
        for f in sorted(lab.tmp.glob("proc-*.log")):
            print("==", f.name, f.read_text(errors="replace")[-8000:])  # room for stacks
        raise
    _assert_holds(lab, spec, lost_commits=1 if fault == "pg_restart" else 0)
    exported = matrix_export.check(lab, capsys)  # every instance it ended, as a test
    assert not exported, "\n".join(exported)


def _assert_holds(lab: Lab, kind: Kind, lost_commits: int = 0) -> None:
    """The checker finds nothing, and ``fsm check`` agrees (exit 0; run in this process)."""
    said = CliRunner().invoke(app, ["check", "--json", "--db", lab.url])
    assert said.exit_code == 0, said.output
    engine = Engine(lab.url)
    try:
        problems = matrix_check.check(engine.store, lab.executions(), lab.deliveries(),
                                      definition=engine.definition,
                                      keys_per_item=kind.keys_per_item,
                                      lost_commits=lost_commits)
    finally:
        engine.close()
    problems += kind.problems(lab)
    if problems:
        _show_evidence(lab, problems[0].split(":")[0])
    assert not problems, "\n".join(problems)


def _show_evidence(lab: Lab, iid: str) -> None:
    """Print (pytest shows it with the failure) the first instance at fault's runs and
    history rows, and the tail of each process's output."""
    for e in lab.executions():
        if e["iid"] == iid:
            print("run", e)
    engine = Engine(lab.url)
    try:
        for h in engine.store.history(iid):
            print("row", h.seq, h.kind, h.source, h.dest, h.at, str(h.detail)[:300])
    finally:
        engine.close()
    for f in sorted(lab.tmp.glob("proc-*.log")):
        print("==", f.name, f.read_text(errors="replace")[-3000:])


# -- the faults ------------------------------------------------------------------------------
def _finish(lab: Lab, kind: Kind, *others: Any) -> None:
    """Run the step again where the fault left it unmade, then let a worker (started here
    unless one is given) finish everything; stop every worker, each exiting 0."""
    workers = list(others) or [lab.worker()]
    # as many rounds as the work asks (an approved call may lead to another approval; under
    # load a round can come before the worker opened the next item), within ``settle``
    ends = time.monotonic() + max(kind.settle, 30.0)
    while kind.todo(lab) and time.monotonic() < ends:
        procs = kind.op(lab, None)
        for proc in procs:
            lab.run(proc)
        if not procs:
            time.sleep(0.2)  # a poll: nothing to do until a worker steps on
    try:
        until(lambda: lab.all_final() and not kind.problems(lab), "every instance to end",
              timeout=kind.settle)
    except AssertionError:
        pass  # the checker names what was left unfinished, and why
    for proc in workers:
        assert lab.stop(proc) == 0, lab.output(proc)[-2000:]


def _held_by(lab: Lab, pid: int) -> list[str]:
    """The unfinished instances a worker of process ``pid`` owns (ids ``host:pid:nonce``)."""
    return [r.id for r in lab.records()
            if r.status not in FINAL_STATUSES and (r.owner or "").split(":")[1:2] == [str(pid)]]


def _taken_from(lab: Lab, pid: int) -> list[str]:
    """The causes of the takeovers (``recovery`` rows) of instances process ``pid`` held."""
    engine = Engine(lab.url)
    try:
        return [h.detail["recovery"]["cause"] for r in engine.store.list()
                for h in engine.store.history(r.id)
                if h.kind == "recovery" and h.detail["recovery"].get("from_pid") == pid]
    finally:
        engine.close()


def _killed_or_skip(lab: Lab, proc: Any) -> None:
    """Wait for a worker to kill itself at a point's 2nd occurrence; when every instance
    ended and stayed ended for 3 s with the worker running on (the group commit made the
    2nd occurrence one with the 1st), stop it and skip the cell, saying so."""
    ended = ended_for(lab)

    def settled() -> bool:
        if proc.poll() is not None:
            return True
        if ended():
            assert lab.stop(proc) == 0, lab.output(proc)[-2000:]
            pytest.skip(NEVER_CAME)
        return False
    until(settled, "the worker to reach its crash point", timeout=60)


def kill(lab: Lab, kind: Kind, point: Point) -> None:
    first = kind.op(lab, point.spec("kill"))[0]
    if point.n > 1 and kind.by_worker:
        _killed_or_skip(lab, first)
    code = lab.run(first)
    assert code == -signal.SIGKILL, f"never reached {point} (exit {code}):\n{lab.output(first)}"
    _finish(lab, kind)
    if kind.by_worker and kind.holds and point.when == "before":  # taken over, pid gone
        assert "process_gone" in _taken_from(lab, first.pid)


def stop(lab: Lab, kind: Kind, point: Point) -> None:
    owner = kind.op(lab, point.spec("stop"))[0]
    wait_stopped(lab, owner, may_not_come=point.n > 1)
    held = _held_by(lab, owner.pid)  # none, after its last commit: nothing to take over
    # SQLite: an owner stopped inside a write transaction (another of its threads was
    # writing) holds the file's write lock, so nobody can take over until it goes on
    # (the README says so): let it go on first, then everything must finish
    locked = lab.write_locked()
    if locked:
        owner.send_signal(signal.SIGCONT)
    other = lab.worker()
    if kind.by_worker and not locked:  # the owner's lease runs out: the other takes over
        try:
            until(lab.all_final, "the other worker to take over and finish", timeout=30 + LEASE)
        except AssertionError as exc:
            states = [(r.id, r.status, r.state, r.seq) for r in lab.records()]
            raise AssertionError(f"{exc}\nrecords: {states}\n{lab.hung(other)}") from None
    owner.send_signal(signal.SIGCONT)
    if kind.by_worker:
        assert not held or locked or "lease_expired" in _taken_from(lab, owner.pid)
        _finish(lab, kind, other, owner)
    else:
        lab.run(owner)
        _finish(lab, kind, other)


def pg_restart(lab: Lab, kind: Kind, point: Point) -> None:
    owner = kind.op(lab, point.spec("stop"))[0]
    wait_stopped(lab, owner, may_not_come=point.n > 1)
    lab.cluster.restart()
    owner.send_signal(signal.SIGCONT)
    if kind.by_worker:  # the worker itself gets over the restart and finishes alone
        until(lambda: lab.all_final() and not kind.problems(lab),
              "the worker to recover from the restart", timeout=60)
        _finish(lab, kind, owner)
    else:
        lab.run(owner)
        _finish(lab, kind)


FAULT_RUNNERS = {"kill": kill, "stop": stop, "pg_restart": pg_restart}
