"""Drive the child processes: W1/W2 round-robin over peers, then W3, W4, micro, profile.

Every measurement runs in a child process started with the same Python as
``bench/run.py``.  W1/W2 keep one long-lived child per peer and interleave
the repetitions (rep 1 of every peer, then rep 2, …) so that load from
other processes on the machine is spread over all peers alike.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .common import DOC_SIZES, TRANSITIONS
from .peers import FLOOR, FSM_VARIANTS, PEERS, SIZED
from .workloads.steps import Task

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 5  # W1 instances per turn when interleaving peers (fsync latency drifts)
Log = Callable[[str], None]


@dataclass
class Params:
    """Sizes and repetitions of one benchmark run."""

    quick: bool
    reps: int
    workdir: str
    only: set[str]
    peers: list[str]
    n1: int
    n2: int
    n2_big: int | None
    n3: int
    model: bool
    profile: bool
    timeout: float
    out: str = ""
    skipped: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    sleep: float = 0.2


@dataclass
class Outcome:
    """Samples of one (workload, peer, synchronous) case, or why there are none."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONHASHSEED", "0")
    return env


class PeerProcess:
    """A long-lived ``python -m bench.child REF`` answering one command per line."""

    def __init__(self, name: str, params: Params) -> None:
        self.name, self.params = name, params
        slug = "".join(c if c.isalnum() else "_" for c in name)
        self.log = open(os.path.join(params.workdir, f"child-{slug}.log"), "a")
        self.proc: subprocess.Popen[str] | None = None
        self.starting = False

    def start(self) -> None:
        """Spawn the child (it imports the peer, then says it is ready)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([self.params.python, "-m", "bench.child", PEERS[self.name]],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.log, text=True, env=child_env(),
                                         cwd=self.params.workdir)
            self.starting = True

    def _read(self) -> dict[str, Any]:
        assert self.proc and self.proc.stdout
        ready, _, _ = select.select([self.proc.stdout], [], [], self.params.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.stop()
            return {"error": f"timeout after {self.params.timeout:.0f} s" if not ready
                    else "child died (see child log)"}
        return json.loads(line)

    def ready(self) -> dict[str, Any]:
        """Wait for the child's first line: ``{}`` or ``{"error": …}`` (import failed)."""
        self.start()
        if not self.starting:
            return {}
        self.starting = False
        answer = self._read()
        return {"error": answer["error"]} if "error" in answer else {}

    def ask(self, **cmd: Any) -> dict[str, Any]:
        """Send one command; its answer, or ``{"error": …}`` (the child is then stopped)."""
        failed = self.ready()
        if failed:
            return failed
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.proc.stdin:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.stop()
        self.log.close()


@dataclass(frozen=True)
class Case:
    """One W1/W2 case: its result key ``label`` (``W1``, ``W2``, ``W1@10000`` …)."""

    label: str
    workload: str
    sync: str
    n: int
    doc: int = 0


def sized_label(doc: int) -> str:
    return f"W1@{doc}"


def steps_cases(p: Params) -> list[Case]:
    cases = []
    if "W1" in p.only:
        cases += [Case("W1", "W1", "FULL", p.n1), Case("W1", "W1", "NORMAL", p.n1)]
        cases += [Case(sized_label(d), "W1", "NORMAL", max(20, p.n1 // 2), d) for d in DOC_SIZES]
    if "W2" in p.only:
        cases.append(Case("W2", "W2", "FULL", p.n2))
    return cases


def _round(procs: dict[str, PeerProcess], outs: dict[str, Outcome], task_of: Callable[[str], Task],
           n: int, chunk: int) -> None:
    """One repetition of one case on every peer: open all, run chunks round-robin, close all."""
    live = [name for name in procs if not outs[name].error]

    def ask(name: str, **cmd: Any) -> dict[str, Any]:
        answer = procs[name].ask(**cmd)
        if "error" in answer:
            outs[name].error = answer["error"]
            live.remove(name)
        return answer

    for name in list(live):
        ask(name, op="open", task=asdict(task_of(name)))
    for done in range(0, n, chunk):
        for name in list(live):
            ask(name, op="run", n=min(chunk, n - done))
    for name in list(live):
        answer = ask(name, op="close")
        if "sample" in answer:
            outs[name].samples.append(answer["sample"])


def run_steps(p: Params, log: Log) -> dict[tuple[str, str, str], Outcome]:
    """W1 and W2 on every peer, repetitions interleaved across peers (W1 in chunks)."""
    results: dict[tuple[str, str, str], Outcome] = {}
    procs = {name: PeerProcess(name, p) for name in p.peers}
    for proc in procs.values():
        proc.start()  # imports happen in parallel, before anything is timed
    for name, proc in procs.items():
        failed = proc.ready()
        if failed:
            log(f"{name}: n/a ({failed['error']})")
            for case in steps_cases(p):
                results[(case.label, case.sync, name)] = Outcome(error=failed["error"])
    try:
        for rep in range(p.reps):
            for case in steps_cases(p):
                names = [n for n in p.peers if not case.doc or n in SIZED]
                outs = {name: results.setdefault((case.label, case.sync, name), Outcome())
                        for name in names}
                started = time.perf_counter()
                _round({n: procs[n] for n in names}, outs,
                       lambda name, c=case: Task(c.workload, PEERS[name], c.sync, p.workdir,
                                                 p.sleep, c.doc),
                       case.n, CHUNK if case.workload == "W1" else case.n)
                log(f"rep {rep + 1}/{p.reps} {case.label} {case.sync:6} {case.n} instances "
                    f"{time.perf_counter() - started:6.1f} s; "
                    + ", ".join(f"{k} {o.samples[-1]['seconds']:.2f}" if not o.error
                                else f"{k} n/a" for k, o in outs.items()))
    finally:
        for proc in procs.values():
            proc.close()
    return results


def run_fsm_big(p: Params, log: Log) -> dict[str, Outcome]:
    """W2 with ``n2_big`` instances, the group-commit floor and each fsm_engine variant
    alone (a fresh child per repetition), repetitions interleaved across them."""
    outs = {name: Outcome() for name in (FLOOR, *FSM_VARIANTS)}
    for rep in range(p.reps):
        for name, out in outs.items():
            if out.error:
                continue
            proc = PeerProcess(name, p)
            started = time.perf_counter()
            _round({"big": proc}, {"big": out},
                   lambda _, name=name: Task("W2", PEERS[name], "FULL", p.workdir, p.sleep),
                   p.n2_big or 0, p.n2_big or 1)
            proc.close()
            log(f"rep {rep + 1}/{p.reps} W2 FULL {name} x{p.n2_big} "
                f"{time.perf_counter() - started:6.1f} s" + (f"  n/a: {out.error}" if out.error else ""))
    return outs


def _module(p: Params, module: str, *args: Any, timeout: float) -> Any:
    out = subprocess.run([p.python, "-m", module, *map(str, args)], capture_output=True,
                         text=True, env=child_env(), cwd=p.workdir, timeout=timeout)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(tail[:200])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_recovery(p: Params, log: Log) -> Outcome:
    """W3: kill and resume, ``reps`` times."""
    from .workloads.recovery import measure
    out = Outcome()
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    for rep in range(p.reps):
        started = time.perf_counter()
        try:
            out.samples.append(measure(p.workdir, p.n3, p.python, timeout=max(p.timeout, 300)))
        except Exception as exc:  # noqa: BLE001 - reported as n/a
            out.error = f"{type(exc).__name__}: {exc}"[:200]
        log(f"rep {rep + 1}/{p.reps} W3 fsm_engine x{p.n3} {time.perf_counter() - started:6.1f} s"
            + (f"  n/a: {out.error}" if out.error else ""))
        if out.error:
            break
    return out


def run_module(p: Params, log: Log, label: str, module: str, *args: Any,
               timeout: float = 600) -> dict[str, Any] | str:
    """Run a measuring module in a child; its JSON, or an ``n/a`` reason string."""
    started = time.perf_counter()
    try:
        result = _module(p, module, *args, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported as n/a
        result = f"{type(exc).__name__}: {exc}"[:200]
    log(f"{label:40} {time.perf_counter() - started:6.1f} s"
        + (f"  n/a: {result}" if isinstance(result, str) else ""))
    return result


def _strace_calls(path: str) -> int:
    """fsync + fdatasync calls in a ``strace -c`` summary file."""
    calls = 0
    with open(path) as fh:
        for line in fh:
            parts = line.split()
            if parts and parts[-1] in ("fsync", "fdatasync"):
                calls += int(parts[3])
    return calls


def _count_fsyncs(p: Params, task: Task, n: int) -> int:
    out = os.path.join(p.workdir, f"strace-{task.tag}-{n}.txt")
    cmd = ["strace", "-f", "-qq", "-c", "-e", "trace=fsync,fdatasync", "-o", out,
           p.python, "-m", "bench.workloads.fsyncs", json.dumps(asdict(task)), str(n)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(),
                          cwd=p.workdir, timeout=p.timeout)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(tail[:200])
    return _strace_calls(out)


def run_fsyncs(p: Params, log: Log) -> dict[tuple[str, str, str], float | str]:
    """fsyncs per durable transition of every peer in W1 (FULL, NORMAL) and W2, counted by
    ``strace -f -c`` in a separate, untimed run (``calls(N) - calls(1)`` over ``6 (N - 1)``)."""
    if shutil.which("strace") is None:
        return {}
    found: dict[tuple[str, str, str], float | str] = {}
    cases = [("W1", "FULL", 20), ("W1", "NORMAL", 20), ("W2", "FULL", p.n2)]
    for name in p.peers:
        started = time.perf_counter()
        for workload, sync, n in cases:
            if workload not in p.only:
                continue
            task = Task(workload, PEERS[name], sync, p.workdir, p.sleep)
            try:  # the baseline runs one instance: a peer may check that it did work
                extra = _count_fsyncs(p, task, n) - _count_fsyncs(p, task, 1)
                found[(workload, sync, name)] = extra / ((n - 1) * TRANSITIONS)
            except Exception as exc:  # noqa: BLE001 - reported as n/a
                found[(workload, sync, name)] = f"{type(exc).__name__}: {exc}"[:120]
        log(f"fsyncs {name:32} {time.perf_counter() - started:6.1f} s")
    return found
