"""Render the collected samples as Markdown tables (medians, spreads, ratios, targets)."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Iterable

from .orchestrate import Outcome, Params
from .peers import FLOOR, FSM, FSM_VARIANTS

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
def us_per_transition(s: dict[str, Any]) -> float:
    return s["seconds"] / s["transitions"] * 1e6


def w1_table(results: dict[tuple[str, str, str], Outcome], sync: str, p: Params) -> str:
    fsm = results.get(("W1", sync, FSM))
    fsm_us = med(map(us_per_transition, fsm.samples)) if fsm and not fsm.error else None
    rows = []
    for name in p.peers:
        out = results.get(("W1", sync, name))
        if out is None or out.error or not out.samples:
            rows.append([name, na(out), "", "", "", ""])
            continue
        us = [us_per_transition(s) for s in out.samples]
        ratio = fsm_us / med(us) if fsm_us else None
        rows.append([name, fmt(med(us)), spread(us), fmt(ratio, 2),
                     fmt(med(s["db_bytes"] for s in out.samples) / 1024),
                     fmt(med(s["rss_mib"] for s in out.samples), 1)])
    rows += [[name, f"n/a ({why})", "", "", "", ""] for name, why in p.skipped.items()]
    head = ["framework", "µs / transition (median)", "min–max", "fsm_engine ÷ this",
            "DB size KiB", "peak RSS MiB"]
    return table(head, rows)


# -- W2 ------------------------------------------------------------------------------------
def w2_row(name: str, out: Outcome | None, ideal: float, fsm_wall: float | None) -> Row:
    if out is None or out.error or not out.samples:
        return [name, na(out), "", "", "", "", ""]
    walls = [s["seconds"] for s in out.samples]
    tps = med(s["transitions"] / s["seconds"] for s in out.samples)
    ratio = fsm_wall / med(walls) if fsm_wall else None
    return [name, fmt(med(walls), 2), spread(walls, 2), fmt(med(walls) / ideal, 1) + "×",
            fmt(tps), fmt(med(s["rss_mib"] for s in out.samples), 1), fmt(ratio, 2)]


def w2_table(results: dict[tuple[str, str, str], Outcome], p: Params) -> str:
    fsm = results.get(("W2", "FULL", FSM))
    fsm_wall = med(s["seconds"] for s in fsm.samples) if fsm and not fsm.error else None
    rows = [w2_row(name, results.get(("W2", "FULL", name)), p.sleep, fsm_wall)
            for name in p.peers]
    rows += [[name, f"n/a ({why})", "", "", "", "", ""] for name, why in p.skipped.items()]
    head = ["framework", "wall s (median)", "min–max", "× ideal", "durable transitions/s",
            "peak RSS MiB", "fsm_engine ÷ this"]
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


# -- targets ---------------------------------------------------------------------------------
def _ratio(results: dict[tuple[str, str, str], Outcome], sync: str, name: str) -> float | None:
    fsm, floor = results.get(("W1", sync, name)), results.get(("W1", sync, FLOOR))
    if not fsm or not floor or fsm.error or floor.error or not fsm.samples or not floor.samples:
        return None
    return med(map(us_per_transition, fsm.samples)) / med(map(us_per_transition, floor.samples))


def _verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "**not met**")


def _label(name: str) -> str:
    return "async def actions" if name == FSM else "plain def actions"


def targets_table(results: dict[tuple[str, str, str], Outcome], big: dict[str, Outcome],
                  w3: Outcome | None, w4: dict[str, Any] | str | None, p: Params) -> str:
    """One row per target and fsm_engine variant (``async def`` / plain ``def`` actions)."""
    rows: list[Row] = []

    def add(target: str, value: float | None, text: Callable[[float], str],
            ok: Callable[[float], bool]) -> None:
        rows.append([target, "n/a" if value is None else text(value),
                     _verdict(None if value is None else ok(value))])

    for sync, limit in (("FULL", 1.3), ("NORMAL", 2.5)):
        for name in FSM_VARIANTS:
            add(f"W1 ≤ {limit}× floor ({sync}), {_label(name)}", _ratio(results, sync, name),
                lambda r: f"{r:.2f}×", lambda r, limit=limit: r <= limit)
    for name in FSM_VARIANTS:
        out = results.get(("W2", "FULL", name))
        wall = med(s["seconds"] for s in out.samples) if out and out.samples and not out.error else None
        add(f"W2 {p.n2} instances ≤ 2× ideal (start + run), {_label(name)}",
            None if wall is None else wall / p.sleep, lambda r: f"{r:.1f}×", lambda r: r <= 2)
    n_big = p.n2_big or 10000
    for name in FSM_VARIANTS:
        out = big.get(name)
        ok_big = out is not None and out.samples and not out.error
        for label, key in (("start + run", "seconds"), ("run only", "run_seconds")):
            tps = med(s["transitions"] / s[key] for s in out.samples) if ok_big else None
            add(f"W2 {n_big} instances ≥ 10,000 durable transitions/s, FULL ({label}), "
                f"{_label(name)}", tps, lambda r: f"{r:,.0f}/s", lambda r: r >= 10000)
        rss = med(s["rss_mib"] for s in out.samples) if ok_big else None
        add(f"W2 {n_big} instances RSS ≤ 1 GiB, {_label(name)}", rss,
            lambda r: f"{r:,.0f} MiB", lambda r: r <= 1024)
    ok3 = w3 is not None and w3.samples
    first = max(x["first_step_s"] or float("inf") for x in w3.samples) if ok3 else None
    add(f"W3 resume starts stepping within 2 s ({p.n3} instances, worst rep)", first,
        lambda r: f"{r:.2f} s", lambda r: r <= 2)
    twice = max(x["executed_twice"] for x in w3.samples) if ok3 else None
    add("W3 zero completed steps executed twice", twice, lambda r: f"{r:.0f}", lambda r: r == 0)
    share = None
    if isinstance(w4, dict) and w4.get("sequential"):
        share = med(r["model_s"] / r["wall_s"] * 100 for r in w4["sequential"])
    add("W4 ≥ 95 % of wall time inside the model call (sequential)", share,
        lambda r: f"{r:.2f} %", lambda r: r >= 95)
    return table(["target (issue 4)", "measured", "verdict"], rows)
