"""Benchmark fsm_engine against its peers (issue 4).

    python bench/run.py [--quick] [--only W1,W2,W3,W4,MICRO] [--model] [--profile]

Workloads (see bench/RESULTS.md for the latest numbers and the method):

- W1 durable step overhead: a linear 7-state machine, instances run one
  after another, every transition committed (synchronous FULL and NORMAL, WAL);
  and under NORMAL at three context sizes (an unchanged ``doc`` of 300 B,
  10 kB, 100 kB) for the floor, ``transitions`` and fsm_engine;
- W2 concurrency: N instances whose ``s2`` action awaits 0.2 s, all in flight;
  plus the group-commit floor and fsm_engine alone with ``--n2-big`` instances;
- fsyncs per transition: every peer once more under ``strace -f -c`` (untimed);
- W3 recovery: SIGKILL a runner mid-flight, ``resume()`` in a new process;
- W4 real model (``--model``): the moderation machine on 3 license files;
- MICRO: a ``transitions`` trigger and a pydantic round trip, for scale.

Every number is the median of ``--reps`` repetitions, each in a child
process, wall time and the child's CPU time (``time.process_time``); peers that fail to
install or run show as ``n/a (reason)``.
Writes the Markdown report to ``bench/RESULTS.md`` (``--out``) and prints it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import orchestrate, report  # noqa: E402
from bench.orchestrate import Params  # noqa: E402
from bench.peers import PEERS  # noqa: E402

WORKLOADS = ("W1", "W2", "W3", "W4", "MICRO")
SLOW_IN_QUICK = ("langgraph (SqliteSaver)", "dbos (SQLite sys db)")
PACKAGES = ("fsm_engine", "transitions", "pydantic", "langgraph", "langgraph-checkpoint-sqlite",
            "apache-burr", "dbos", "llama_cpp_python")


def parse(argv: list[str]) -> Params:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes, without LangGraph and DBOS unless --peers; under a minute")
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(WORKLOADS))
    ap.add_argument("--peers", default="", help="comma-separated substrings of framework names")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per case (≥ 3 for the report)")
    ap.add_argument("--model", action="store_true", help="run W4 with the embedded model")
    ap.add_argument("--profile", action="store_true", help="cProfile fsm_engine in W1/W2")
    ap.add_argument("--n1", type=int, help="W1 instances (500; quick 50)")
    ap.add_argument("--n2", type=int, help="W2 instances per framework (200)")
    ap.add_argument("--n2-big", type=int, help="W2 instances, fsm_engine alone (10,000; quick: skip)")
    ap.add_argument("--n3", type=int, help="W3 instances (10,000; quick 1,000)")
    ap.add_argument("--timeout", type=float, help="seconds one task may take (300; quick 60)")
    ap.add_argument("--workdir", help="where databases go (default: a new temp dir)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"), help="report path")
    a = ap.parse_args(argv)
    only = {w.strip().upper() for w in a.only.split(",") if w.strip()} or set(WORKLOADS)
    q = a.quick
    if a.peers:
        peers = [n for n in PEERS if any(s.lower() in n.lower() for s in a.peers.split(","))]
    else:
        peers = [n for n in PEERS if not (q and n in SLOW_IN_QUICK)]
    for must in ("floor (raw SQLite)", "fsm_engine"):
        if must not in peers:
            peers.insert(0, must)
    skipped = {n: "skipped by --quick: several s per repetition; see the full run" if q
               else "not selected by --peers" for n in PEERS if n not in peers}
    params = Params(
        quick=q, reps=a.reps, workdir=a.workdir or tempfile.mkdtemp(prefix="fsm-bench-"),
        only=only, peers=peers, n1=a.n1 or (50 if q else 500), n2=a.n2 or 200,
        n2_big=a.n2_big if a.n2_big is not None else (None if q else 10000),
        n3=a.n3 or (1000 if q else 10000), model=a.model, profile=a.profile,
        timeout=a.timeout or (60 if q else 300), out=a.out, skipped=skipped)
    return params


def versions() -> str:
    found = []
    for pkg in PACKAGES:
        try:
            found.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            found.append(f"{pkg} (not installed)")
    return ", ".join(found)


def revision() -> str:
    """The commit fsm_engine was measured at (and whether fsm_engine/ had local changes)."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD") or "unknown"
        return head + (" + uncommitted changes in fsm_engine/"
                       if git("status", "--porcelain", "--", "fsm_engine") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def header(p: Params, load_before: tuple[float, ...], elapsed: float) -> str:
    mode = "--quick" if p.quick else "full"
    return "\n".join([
        "# fsm_engine benchmark results (issues 4 and 9)", "",
        f"Generated by `python bench/run.py{' --quick' if p.quick else ''}"
        f"{' --model' if p.model else ''}{' --profile' if p.profile else ''}` on "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} ({mode} run, "
        f"{elapsed / 60:.1f} min).", "",
        f"- Machine: {os.cpu_count()} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}; load average "
        f"{load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (other jobs "
        "were running: absolute numbers are noisy, ratios within one repetition round less so).",
        f"- fsm_engine at git revision {revision()}; versions: {versions()}.",
        f"- Sizes: W1 {p.n1} instances, W2 {p.n2} (+ {p.n2_big or 'no'} for fsm_engine alone), "
        f"W3 {p.n3}; {p.reps} repetitions each, interleaved across frameworks; medians shown.",
    ])


def render(p: Params, steps: dict, big: dict[str, orchestrate.Outcome],
           w3: orchestrate.Outcome | None,
           w4: object, micro: object, prof: object, load_before: tuple[float, ...],
           elapsed: float, fsyncs: dict | None = None) -> str:
    from bench.method import METHOD
    parts = [header(p, load_before, elapsed), "", "## Targets (issue 9)", "",
             report.targets_table(steps, big, w3, w4, p)]  # type: ignore[arg-type]
    if "W1" in p.only:
        parts += _w1_parts(p, steps, fsyncs)
    if "W2" in p.only:
        parts += _w2_parts(p, steps, big, fsyncs)
    if "W3" in p.only:
        parts += ["", f"## W3 recovery after SIGKILL, {p.n3} instances", "",
                  report.w3_table(w3)]
    if "W4" in p.only:
        parts += ["", "## W4 real model (moderation machine, embedded Gemma 3 270M)", "",
                  report.w4_table(w4)]  # type: ignore[arg-type]
    if "MICRO" in p.only:
        parts += ["", "## For scale", "", report.micro_table(micro)]  # type: ignore[arg-type]
    if p.profile:
        parts += ["", "## Profile of fsm_engine (cProfile)", "",
                  report.profile_section(prof)]  # type: ignore[arg-type]
    parts += ["", METHOD]
    return "\n".join(parts) + "\n"


def _w1_parts(p: Params, steps: dict, fsyncs: dict | None) -> list[str]:
    """The W1 sections of the report: both synchronous modes, then three context sizes."""
    parts: list[str] = []
    for sync in ("FULL", "NORMAL"):
        parts += ["", f"## W1 durable step overhead, synchronous={sync} (WAL), "
                  f"{p.n1} instances one after another", "",
                  report.w1_table(steps, sync, p, fsyncs)]
    return parts + ["", "## W1 at three context sizes, synchronous=NORMAL, "
                    f"{max(20, p.n1 // 2)} instances one after another", "",
                    "The context holds `n` and a `doc` string no action changes; CPU µs per "
                    "transition of the peer's process (÷ the floor's at the same size), then "
                    "wall µs.", "", report.w1_sized_table(steps, p)]


def _w2_parts(p: Params, steps: dict, big: dict[str, orchestrate.Outcome],
              fsyncs: dict | None) -> list[str]:
    """The W2 sections of the report (and the big runs, when there were any)."""
    parts = ["", f"## W2 concurrency, {p.n2} instances in flight, synchronous=FULL", "",
             f"Ideal = {p.sleep} s (one sleeping state on the critical path). "
             "Wall time covers creating the instances and running them to the end; "
             "the floor group-commits.", "",
             report.w2_table(steps, p, fsyncs), "",
             report.w2_split_table(f"fsm_engine, {p.n2} instances", steps.get(
                 ("W2", "FULL", "fsm_engine")), p)]
    if p.n2_big and big:
        parts += ["", f"## W2 with {p.n2_big:,} instances in flight, each alone, "
                  "synchronous=FULL", "", report.big_table(big, p)]
    for name in big if p.n2_big else ():
        parts += ["", report.w2_split_table(f"{name} alone, {p.n2_big} instances",
                                            big[name], p)]
    return parts


def main(argv: list[str]) -> int:
    p = parse(argv)
    os.makedirs(p.workdir, exist_ok=True)
    load_before, started = os.getloadavg(), time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    log(f"workdir {p.workdir}; peers: {', '.join(p.peers)}")
    steps = orchestrate.run_steps(p, log)
    big = orchestrate.run_fsm_big(p, log) if "W2" in p.only and p.n2_big else {}
    fsyncs = orchestrate.run_fsyncs(p, log) if p.only & {"W1", "W2"} else {}
    w3 = orchestrate.run_recovery(p, log) if "W3" in p.only else None
    micro = (orchestrate.run_module(p, log, "MICRO", "bench.workloads.micro", p.reps)
             if "MICRO" in p.only else None)
    w4 = (orchestrate.run_module(p, log, "W4 model", "bench.workloads.model", p.workdir, p.reps,
                                 timeout=3600) if "W4" in p.only and p.model else None)
    prof = (orchestrate.run_module(p, log, "profile", "bench.workloads.profile", p.workdir,
                                   min(p.n1, 200), 2000 if not p.quick else p.n2)
            if p.profile else None)
    text = render(p, steps, big, w3, w4, micro, prof, load_before, time.perf_counter() - started,
                  fsyncs)
    Path(p.out).write_text(text)
    print(text)
    log(f"wrote {p.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
