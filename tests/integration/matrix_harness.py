"""The intersection matrix's world: one store, real ``fsm`` processes, a crash point.

A ``Lab`` is one cell's store (SQLite file or PostgreSQL schema), its execution log and
sink (``tests/integration/matrix_machines.py`` appends to them) and the processes it starts: real
``python -m fsm_engine.cli`` commands (``worker``, ``review decide``, ``rerun``, ``fork``,
``migrate``) and a two-line ``Engine.send`` script, each given ``FSM_CRASH_AT``
(``fsm_engine.store.crash``) when it is the one to stop at the cell's commit point.
``matrix_check.check`` asserts the invariants once the cell has run.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matrix_agent
import matrix_stream
import pytest
from procs import stopped, wait_until

from fsm_engine import Engine
from fsm_engine.store import FINAL_STATUSES, open_store

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests/integration/matrix_machines.py"
#: The lease of every worker a cell starts (a SIGSTOPped one is taken over after it).
LEASE = 1.0
SEND = ("import asyncio, sys\nfrom fsm_engine import Engine\n"
        "e = Engine(sys.argv[1])\nasyncio.run(e.send(sys.argv[2], 'go'))\ne.close()\n")


@dataclass(frozen=True)
class Point:
    """A commit point: ``FSM_CRASH_AT`` without its signal (``METHOD:WHEN:N:LABEL``)."""

    method: str
    when: str
    label: str
    n: int = 1

    def spec(self, sig: str) -> str:
        return f"{self.method}:{self.when}:{self.n}:{self.label}:{sig}"

    def __str__(self) -> str:
        return f"{self.method}-{self.when}-{self.label}-{self.n}"


class Lab:
    """One cell: a store at ``url``, files in ``tmp``, the processes it started."""

    def __init__(self, url: str, tmp: Path, cluster: Any = None) -> None:
        self.url, self.tmp, self.cluster = url, tmp, cluster
        self.log, self.sink = tmp / "runs.jsonl", tmp / "sink.jsonl"
        self.script = script = tmp / "script.jsonl"
        script.write_text("".join(json.dumps(line) + "\n"
                                for line in [*matrix_stream.SCRIPT, *matrix_agent.SCRIPT]))
        self.env = dict(os.environ, PYTHONPATH=str(ROOT), FSM_MACHINES_ROOT=str(ROOT),
                        MATRIX_LOG=str(self.log), MATRIX_SINK=str(self.sink),
                        FSM_LLM=f"scripted:{script}", PYTHONUNBUFFERED="1",
                        PYTHONFAULTHANDLER="1")
        self.env.pop("FSM_CRASH_AT", None)
        self.procs: list[subprocess.Popen[bytes]] = []

    # -- processes ---------------------------------------------------------------------
    def spawn(self, argv: list[str], crash: str | None = None,
              **env: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` (its output in ``tmp/proc-N.log``), crashing at ``crash``."""
        extra = {**env, **({"FSM_CRASH_AT": crash} if crash else {})}
        out = open(self.tmp / f"proc-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env={**self.env, **extra}, stdout=out,
                                stderr=subprocess.STDOUT)
        out.close()
        self.procs.append(proc)
        return proc

    def fsm(self, *args: str, crash: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        """``fsm ARGS --db URL`` as a process."""
        return self.spawn([sys.executable, "-m", "fsm_engine.cli", *args, "--db", self.url],
                          crash, **env)

    def worker(self, crash: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        return self.fsm("worker", "--lease", str(LEASE), "--poll", "0.1", "--grace", "5",
                        crash=crash, **env)

    def send(self, iid: str, crash: str | None = None) -> subprocess.Popen[bytes]:
        return self.spawn([sys.executable, "-c", SEND, self.url, iid], crash)

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.tmp / f"proc-{self.procs.index(proc)}.log").read_text(errors="replace")

    def run(self, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
        """Wait for ``proc``; its exit code (``-9`` when SIGKILLed)."""
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{proc.args!r} still running after {timeout} s:\n"
                                 f"{self.hung(proc)}") from None

    def hung(self, proc: subprocess.Popen[bytes]) -> str:
        """Evidence of why ``proc`` hangs: the PostgreSQL sessions and who blocks whom (a
        PostgreSQL cell; ``""`` on SQLite).  ``proc`` is ended by SIGABRT, on which
        ``PYTHONFAULTHANDLER`` writes every thread's stack to its log (the failing cell
        prints each process's log)."""
        sessions = pg_sessions(self.url) if self.url.startswith("postgres") else ""
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        return sessions

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
        """SIGCONT + SIGTERM ``proc`` (a worker drains and exits 0) once it has started
        serving (a SIGTERM during its imports would just end it); its exit code."""
        proc.send_signal(signal.SIGCONT)
        until(lambda: proc.poll() is not None or "fsm worker " in self.output(proc),
              "the worker to start", timeout)
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        return self.run(proc, timeout)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)

    # -- the store -----------------------------------------------------------------------
    def engine(self, llm: Any = None) -> Engine:
        return Engine(self.url, llm=llm)

    def records(self) -> list[Any]:
        store = open_store(self.url)
        try:
            return store.list()
        finally:
            store.close()

    def write_locked(self) -> bool:
        """True when another process holds the SQLite file's write lock (a writer stopped
        inside its write transaction); False at once otherwise, and on PostgreSQL."""
        if self.url.startswith("postgres"):
            return False
        # (a cell's SQLite url is a plain path: the check once looked for "sqlite" only)
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=0)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.rollback()
            return False
        except sqlite3.OperationalError as exc:
            assert "database is locked" in str(exc), exc
            return True
        finally:
            conn.close()

    def all_final(self) -> bool:
        return all(r.status in FINAL_STATUSES for r in self.records())

    def executions(self) -> list[dict[str, Any]]:
        return _lines(self.log)

    def deliveries(self) -> list[dict[str, Any]]:
        return _lines(self.sink)


#: PostgreSQL's sessions of the cell's database, with the pids each one waits for.
SESSIONS = ("SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid) AS blocked_by, "
            "now() - xact_start AS xact_age, left(query, 120) AS query FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid")


def pg_sessions(url: str) -> str:
    """``SESSIONS`` as text lines (one error line when the server does not answer)."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            rows = conn.execute(SESSIONS).fetchall()
    except psycopg.Error as exc:
        return f"pg_stat_activity: {type(exc).__name__}\n"
    return "pg_stat_activity:\n" + "".join(f"  {row}\n" for row in rows)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def until(predicate: Callable[[], bool], what: str, timeout: float = 60.0,
          interval: float = 0.05) -> None:
    """Poll ``predicate`` until true; ``AssertionError`` naming ``what`` after ``timeout``."""
    wait_until(predicate, timeout, what, interval)


#: Why a cell whose fault never came is skipped (full mode: a point's 2nd occurrence).
NEVER_CAME = ("the crash point never came: every instance ended first (a 2nd occurrence "
              "the group commit made one with the 1st)")


def ended_for(lab: Lab, seconds: float = 3.0) -> Callable[[], bool]:
    """A poll: True once every instance of ``lab`` has been final for ``seconds`` in a row
    (a worker running on then has no crash point left to reach)."""
    since: list[float] = []

    def check() -> bool:
        if not lab.all_final():
            since.clear()
            return False
        if not since:
            since.append(time.monotonic())
        return time.monotonic() - since[0] > seconds
    return check


def wait_stopped(lab: Lab, proc: subprocess.Popen[bytes], timeout: float = 60.0, *,
                 may_not_come: bool = False) -> None:
    """Wait until ``proc`` stopped itself at its crash point (it must not exit first).
    ``may_not_come`` (a point's 2nd occurrence): when every instance ended and stayed
    ended for 3 s with ``proc`` running on, the cell is skipped, saying why."""
    ended = ended_for(lab)

    def check() -> bool:
        assert proc.poll() is None, (f"exited {proc.returncode} before its crash point:\n"
                                     f"{lab.output(proc)[-2000:]}")
        if stopped(proc):
            return True
        if may_not_come and ended():
            pytest.skip(NEVER_CAME)
        return False
    until(check, "the process to reach its crash point", timeout)


def families(records: list[Any]) -> Iterator[tuple[Any, list[Any]]]:
    """Each instance with its direct children (by ``parent_id``)."""
    kids: dict[str, list[Any]] = {}
    for rec in records:
        if rec.parent_id:
            kids.setdefault(rec.parent_id, []).append(rec)
    for rec in records:
        yield rec, kids.get(rec.id, [])
