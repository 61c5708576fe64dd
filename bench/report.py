"""Render the collected samples as Markdown tables (medians, spreads, ratios, targets)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

from .common import DOC_SIZES
from .orchestrate import Outcome, Params, sized_label
from .peers import FLOOR, FSM, FSM_DEF, FSM_INLINE, FSM_VARIANTS, SIZED

Row = list[str]


def med(values: Iterable[float]) -> float:
    vals = list(values)
    return statistics.median(vals) if vals else float("nan")


def table(head: Row, rows: list[Row]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def fmt(x: float | None, digits: int = 0) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:,.{digits}f}"


def spread(values: list[float], digits: int = 0) -> str:
    return f"{fmt(min(values), digits)}–{fmt(max(values), digits)}" if values else "–"


def na(out: Outcome | None) -> str:
    reason = out.error if out and out.error else "not run"
    return f"n/a ({reason})"


# -- W1 ------------------------------------------------------------------------------------
Fsyncs = dict[tuple[str, str, str], "float | str"]


def us_per_transition(s: dict[str, Any]) -> float:
    return s["seconds"] / s["transitions"] * 1e6


def cpu_per_transition(s: dict[str, Any]) -> float:
    """Process CPU µs per durable transition (every thread of the peer's child)."""
    return s.get("cpu_seconds", float("nan")) / s["transitions"] * 1e6


def fsyncs_cell(fsyncs: Fsyncs, key: tuple[str, str, str]) -> str:
    value = fsyncs.get(key)
    if value is None:
        return "–"
    return f"n/a ({value})" if isinstance(value, str) else f"{value:.2f}"


def _cpu(results: dict[tuple[str, str, str], Outcome], key: tuple[str, str, str]
         ) -> float | None:
    out = results.get(key)
    if out is None or out.error or not out.samples:
        return None
    return med(map(cpu_per_transition, out.samples))


def w1_table(results: dict[tuple[str, str, str], Outcome], sync: str, p: Params,
             fsyncs: Fsyncs | None = None) -> str:
    floor_cpu = _cpu(results, ("W1", sync, FLOOR))
    rows = []
    for name in p.peers:
        out = results.get(("W1", sync, name))
        if out is None or out.error or not out.samples:
            rows.append([name, na(out), "", "", "", "", "", ""])
            continue
        us = [us_per_transition(s) for s in out.samples]
        cpu = med(map(cpu_per_transition, out.samples))
        rows.append([name, fmt(med(us)), spread(us), fmt(cpu),
                     fmt(cpu / floor_cpu, 2) + "×" if floor_cpu else "–",
                     fsyncs_cell(fsyncs or {}, ("W1", sync, name)),
                     fmt(med(s["db_bytes"] for s in out.samples) / 1024),
                     fmt(med(s["rss_mib"] for s in out.samples), 1)])
    rows += [[name, f"n/a ({why})", "", "", "", "", "", ""] for name, why in p.skipped.items()]
    head = ["framework", "wall µs / transition (median)", "min–max", "CPU µs / transition",
            "CPU ÷ floor's", "fsyncs / transition", "DB size KiB", "peak RSS MiB"]
    return table(head, rows)


def w1_sized_table(results: dict[tuple[str, str, str], Outcome], p: Params) -> str:
    """CPU (and wall) µs per transition at each context size, synchronous=NORMAL."""
    rows = []
    for name in [n for n in p.peers if n in SIZED]:
        row = [name]
        for doc in DOC_SIZES:
            key = (sized_label(doc), "NORMAL", name)
            cpu, floor = _cpu(results, key), _cpu(results, (sized_label(doc), "NORMAL", FLOOR))
            out = results.get(key)
            wall = (med(map(us_per_transition, out.samples))
                    if out and out.samples and not out.error else None)
            row += ["n/a" if cpu is None else f"{fmt(cpu)} ({fmt(cpu / floor, 2)}×)"
                    if floor else fmt(cpu), fmt(wall)]
        rows.append(row)
    head = ["framework"]
    for doc in DOC_SIZES:
        head += [f"CPU µs ({doc:,} B doc; ÷ floor)", f"wall µs ({doc:,} B)"]
    return table(head, rows)


# -- W2 ------------------------------------------------------------------------------------
def w2_row(name: str, out: Outcome | None, ideal: float, floor_wall: float | None,
           fsyncs: str) -> Row:
    if out is None or out.error or not out.samples:
        return [name, na(out), "", "", "", "", "", "", ""]
    walls = [s["seconds"] for s in out.samples]
    tps = med(s["transitions"] / s["seconds"] for s in out.samples)
    ratio = med(walls) / floor_wall if floor_wall else None
    return [name, fmt(med(walls), 2), spread(walls, 2), fmt(med(walls) / ideal, 1) + "×",
            fmt(ratio, 2) + "×" if ratio else "–", fmt(tps),
            fmt(med(map(cpu_per_transition, out.samples))), fsyncs,
            fmt(med(s["rss_mib"] for s in out.samples), 1)]


def w2_table(results: dict[tuple[str, str, str], Outcome], p: Params,
             fsyncs: Fsyncs | None = None) -> str:
    floor = results.get(("W2", "FULL", FLOOR))
    floor_wall = (med(s["seconds"] for s in floor.samples)
                  if floor and floor.samples and not floor.error else None)
    rows = [w2_row(name, results.get(("W2", "FULL", name)), p.sleep, floor_wall,
                   fsyncs_cell(fsyncs or {}, ("W2", "FULL", name))) for name in p.peers]
    rows += [[name, f"n/a ({why})", "", "", "", "", "", "", ""]
             for name, why in p.skipped.items()]
    head = ["framework", "wall s (median)", "min–max", "× ideal", "wall ÷ floor's",
            "durable transitions/s", "CPU µs / transition", "fsyncs / transition",
            "peak RSS MiB"]
    return table(head, rows)


def big_table(big: dict[str, Outcome], p: Params) -> str:
    """W2 with ``n2_big`` instances: the group-commit floor and each fsm_engine variant."""
    floor = big.get(FLOOR)
    floor_wall = (med(s["seconds"] for s in floor.samples)
                  if floor and floor.samples and not floor.error else None)
    rows = [w2_row(name, out, p.sleep, floor_wall, "–") for name, out in big.items()]
    head = ["framework", "wall s (median)", "min–max", "× ideal", "wall ÷ floor's",
            "durable transitions/s", "CPU µs / transition", "fsyncs / transition",
            "peak RSS MiB"]
    return table(head, rows)


def w2_split_table(label: str, out: Outcome | None, p: Params) -> str:
    """fsm_engine's wall split into starting (``Engine.start`` × N) and running."""
    if out is None or out.error or not out.samples:
        return f"{label}: {na(out)}"
    rows = []
    for phase, key in (("start + run", "seconds"), ("start only", "start_seconds"),
                       ("run only (run_many)", "run_seconds")):
        vals = [s[key] for s in out.samples]
        tps = med(s["transitions"] / s[key] for s in out.samples) if key != "start_seconds" else None
        rows.append([phase, fmt(med(vals), 2), spread(vals, 2),
                     fmt(med(vals) / p.sleep, 1) + "×" if key != "start_seconds" else "",
                     fmt(tps)])
    rss = fmt(med(s["rss_mib"] for s in out.samples), 1)
    head = ["phase", "seconds (median)", "min–max", "× ideal", "durable transitions/s"]
    return f"{label} (peak RSS {rss} MiB)\n\n" + table(head, rows)


# -- W3 ------------------------------------------------------------------------------------
def w3_table(out: Outcome | None) -> str:
    if out is None or not out.samples:
        return na(out)
    s = out.samples
    rows = [["instances", fmt(s[0]["n"])],
            ["transitions committed at the kill (median)", fmt(med(x["committed_at_kill"] for x in s))],
            ["instances in flight at the kill (median)", fmt(med(x["in_flight_at_kill"] for x in s))],
            ["resume() → first committed step, s (median, min–max)",
             f"{fmt(med(x['first_step_s'] for x in s), 2)} ({spread([x['first_step_s'] for x in s], 2)})"],
            ["resume() → all instances final, s (median, min–max)",
             f"{fmt(med(x['all_final_s'] for x in s), 2)} ({spread([x['all_final_s'] for x in s], 2)})"],
            ["instances not completed after resume (max)", fmt(max(x["not_completed"] for x in s))],
            ["committed steps executed twice (max)", fmt(max(x["executed_twice"] for x in s))],
            ["uncommitted actions re-run after the kill (median; at-least-once, expected)",
             fmt(med(x["reruns"] for x in s))],
            ["transition rows at the end / expected", f"{s[-1]['committed_total']:,} / "
                                                    f"{s[-1]['expected_transitions']:,}"]]
    if "takeovers" in s[-1]:  # one ``recovery`` row per instance resume() took over
        rows.append(["takeover (recovery) rows written by resume()",
                     fmt(s[-1]["takeovers"])])
    text = table(["W3 (fsm_engine, synchronous=FULL)", "value"], rows)
    return text + (f"\n\nLater repetitions failed: {out.error}" if out.error else "")


# -- W4 / micro / profile -----------------------------------------------------------------
def w4_table(result: dict[str, Any] | str | None) -> str:
    if result is None:
        return "Skipped (run with `--model`)."
    if isinstance(result, str):
        return f"n/a ({result})"
    rows = []
    for mode in ("sequential", "run_many"):
        runs = result.get(mode) or []
        if not runs:
            continue
        shares = [r["model_s"] / r["wall_s"] * 100 for r in runs]
        rows.append([mode, fmt(med(r["wall_s"] for r in runs), 1),
                     fmt(med(r["model_s"] for r in runs), 1), fmt(med(shares), 2) + " %",
                     spread(shares, 2), str(runs[0]["calls"]),
                     ", ".join(sorted(set(map(str, runs[0]["sources"]))))])
    head = ["arrangement", "wall s", "inside model s", "share in model (median)", "min–max",
            "model calls / run", "verdict sources"]
    return (f"Files: {', '.join(result['files'])}; model load {fmt(result['load_s'], 1)} s "
            "(before timing).\n\n" + table(head, rows))


def micro_table(result: dict[str, Any] | str | None) -> str:
    if result is None:
        return "Skipped."
    if isinstance(result, str):
        return f"n/a ({result})"
    rows = [[name, fmt(med(vals), 1), spread(vals, 1)] for name, vals in result.items()]
    return table(["operation", "µs (median)", "min–max"], rows)


def profile_section(result: dict[str, Any] | str | None) -> str:
    if result is None:
        return "Not run (use `--profile`)."
    if isinstance(result, str):
        return f"n/a ({result})"
    parts = []
    for case, data in result.items():
        rows = [[f"`{name}`", fmt(calls), f"{share * 100:.1f} %"] for name, calls, share in data["self"][:10]]
        cum = [[f"`{name}`", fmt(calls), f"{share * 100:.1f} %"]
               for name, calls, share in data["cumulative"][:10]]
        parts.append(f"**{case}**, profiled wall {data['wall_s']:.2f} s\n\n"
                     + table(["self time: function", "calls", "share of wall"], rows) + "\n\n"
                     + table(["cumulative: fsm_engine function", "calls", "share of wall"], cum))
    return "\n\n".join(parts)


# -- targets (issue 9) ------------------------------------------------------------------------
def _verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "**not met**")


def _label(name: str) -> str:
    return {FSM: "async def", FSM_DEF: "plain def", FSM_INLINE: "def, inline"}.get(name, name)


def _wall(out: Outcome | None, key: str = "seconds") -> float | None:
    return med(s[key] for s in out.samples) if out and out.samples and not out.error else None


class Targets:
    """Rows of the targets table: ``add(target, value, shown, ok)``."""

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, target: str, value: float | None, text: Callable[[float], str],
            ok: Callable[[float], bool]) -> None:
        self.rows.append([target, "n/a" if value is None else text(value),
                          _verdict(None if value is None else ok(value))])

    def ratio(self, target: str, num: float | None, den: float | None, limit: float) -> None:
        value = num / den if num is not None and den else None
        self.add(target, value, lambda r: f"{r:.2f}×", lambda r: r <= limit)


def _w2_targets(t: Targets, results: dict[tuple[str, str, str], Outcome],
                big: dict[str, Outcome], p: Params) -> None:
    floor200 = _wall(results.get(("W2", "FULL", FLOOR)))
    for name in FSM_VARIANTS:
        t.ratio(f"W2 {p.n2} in flight ≤ 1.3× the floor's wall, {_label(name)}",
                _wall(results.get(("W2", "FULL", name))), floor200, 1.3)
    n_big = p.n2_big or 10000
    floor_big = _wall(big.get(FLOOR))
    for name in FSM_VARIANTS:
        out = big.get(name)
        t.ratio(f"W2 {n_big:,} in flight ≤ 1.5× the floor's wall, {_label(name)}",
                _wall(out), floor_big, 1.5)
    out = big.get(FSM)
    tps = med(s["transitions"] / s["seconds"] for s in out.samples) if _wall(out) else None
    t.add(f"W2 {n_big:,} in flight ≥ 20,000 durable transitions/s, async def", tps,
          lambda r: f"{r:,.0f}/s", lambda r: r >= 20000)
    for name in (FSM_DEF, FSM_INLINE):
        t.ratio(f"W2 {n_big:,} in flight: {_label(name)} ≤ 1.3× async def's wall",
                _wall(big.get(name)), _wall(big.get(FSM)), 1.3)
    for name in FSM_VARIANTS:
        out = big.get(name)
        rss = med(s["rss_mib"] for s in out.samples) if _wall(out) else None
        t.add(f"W2 {n_big:,} in flight peak RSS ≤ 200 MiB, {_label(name)}", rss,
              lambda r: f"{r:,.0f} MiB", lambda r: r <= 200)


def targets_table(results: dict[tuple[str, str, str], Outcome], big: dict[str, Outcome],
                  w3: Outcome | None, w4: dict[str, Any] | str | None, p: Params) -> str:
    """One row per issue-9 target and fsm_engine variant."""
    t = Targets()
    for doc in DOC_SIZES:
        label = sized_label(doc)
        floor = _cpu(results, (label, "NORMAL", FLOOR))
        for name in FSM_VARIANTS:
            t.ratio(f"W1 NORMAL CPU per step ≤ 2.5× floor's, {doc:,} B doc, {_label(name)}",
                    _cpu(results, (label, "NORMAL", name)), floor, 2.5)
        for name in (FSM_DEF, FSM_INLINE):
            t.ratio(f"W1 NORMAL CPU per step, {doc:,} B doc: {_label(name)} ≤ 1.3× async def's",
                    _cpu(results, (label, "NORMAL", name)), _cpu(results, (label, "NORMAL", FSM)),
                    1.3)
    _w2_targets(t, results, big, p)
    ok3 = w3 is not None and bool(w3.samples)
    first = max(x["first_step_s"] or float("inf") for x in w3.samples) if ok3 else None
    t.add(f"W3 resume of {p.n3:,} killed instances: first step ≤ 0.5 s (worst rep)", first,
          lambda r: f"{r:.2f} s", lambda r: r <= 0.5)
    fresh = _wall(big.get(FSM)) if p.n3 == (p.n2_big or 0) else None
    t.ratio(f"W3 resume: all final ≤ 1.5× a fresh run of the same work (W2 {p.n3:,}, async)",
            med(x["all_final_s"] for x in w3.samples) if ok3 else None, fresh, 1.5)
    twice = max(x["executed_twice"] for x in w3.samples) if ok3 else None
    t.add("W3 zero completed steps executed twice", twice, lambda r: f"{r:.0f}",
          lambda r: r == 0)
    return table(["target (issue 9)", "measured", "verdict"], t.rows)
