"""``fsm stats`` and ``fsm_engine.stats``: every figure equals an independent count made
from the full history (``Store.history``) and the instance records (``Store.list``)."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

import pytest
from observe_fixtures import Fleet
from typer.testing import CliRunner

from fsm_engine import SqliteStore
from fsm_engine.cli import app
from fsm_engine.stats import Dist, percentile


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(p / 100 * len(ordered)) - 1]


def expected(db: str, machine: str) -> dict:
    """The figures of one machine, counted from full records and full history rows."""
    store = SqliteStore(db)
    recs = store.list(machine=machine)
    per_state: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[str, Counter] = defaultdict(Counter)
    edges: Counter = Counter()
    edge_instances: Counter = Counter()
    fallback = reask = seen = 0
    for rec in recs:
        rows = store.history(rec.id)
        if not rows:
            continue
        seen += 1
        fallback += any(r.kind == "fallback" for r in rows)
        reask += any(r.detail.get("reasks", 0) > 0 for r in rows)
        counts[rows[0].source]["entered"] += 1
        entered = rec.created_at
        for r in rows:
            per_state[r.source]["tokens"].append(r.tokens)
            per_state[r.source]["wall_s"].append(r.at - entered)
            counts[r.source]["steps"] += 1
            counts[r.source]["retries"] += r.detail.get("attempt", 1) - 1
            counts[r.source]["fallbacks"] += r.kind == "fallback"
            counts[r.dest]["entered"] += 1
            edges[(r.source, r.dest, r.trigger, r.kind)] += 1
            entered = r.at
        for key in {(r.source, r.dest, r.trigger, r.kind) for r in rows}:
            edge_instances[key] += 1
    store.close()
    return {"recs": recs, "per_state": per_state, "counts": counts, "edges": edges,
            "edge_instances": edge_instances, "fallback_rate": fallback / seen,
            "reask_rate": reask / seen}


def cli_stats(db: str, *args: str) -> dict:
    result = CliRunner().invoke(app, ["stats", "--db", db, "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_stats_json_equals_an_independent_count_from_the_history(fleet: Fleet) -> None:
    figures = cli_stats(fleet.db)
    assert set(figures) == {"moderation", "router", "quoted"}
    for machine in figures:
        got, want = figures[machine], expected(fleet.db, machine)
        recs = want["recs"]
        assert got["instances"] == len(recs) == len(fleet.ids[machine])
        assert got["by_status"] == dict(Counter(r.status for r in recs))
        assert got["by_state"] == dict(Counter(r.state for r in recs))
        assert got["by_reason"] == dict(Counter(r.reason for r in recs if r.reason))
        assert got["fallback_rate"] == pytest.approx(want["fallback_rate"])
        assert got["reask_rate"] == pytest.approx(want["reask_rate"])
        for name, values in want["per_state"].items():
            st = got["states"][name]
            tokens, wall = values["tokens"], values["wall_s"]
            assert st["steps"] == len(tokens) == want["counts"][name]["steps"]
            assert st["tokens"]["total"] == sum(tokens)
            assert st["tokens"]["max"] == max(tokens)
            assert st["tokens"]["p50"] == nearest_rank(tokens, 50)
            assert st["tokens"]["p95"] == nearest_rank(tokens, 95)
            assert st["wall_s"]["max"] == pytest.approx(max(wall))
            assert st["wall_s"]["p50"] == pytest.approx(nearest_rank(wall, 50))
            assert st["retries"] == want["counts"][name]["retries"]
            assert st["fallbacks"] == want["counts"][name]["fallbacks"]
            assert st["entered"] == want["counts"][name]["entered"]
            assert st["now"] == sum(r.state == name for r in recs)
        assert {(e["source"], e["dest"], e["trigger"], e["kind"]): e["taken"]
                for e in got["edges"]} == dict(want["edges"])
        assert {(e["source"], e["dest"], e["trigger"], e["kind"]): e["instances"]
                for e in got["edges"]} == dict(want["edge_instances"])


def test_the_fleet_exercises_retries_fallbacks_failures_and_sources(fleet: Fleet) -> None:
    figures = cli_stats(fleet.db)
    mod = figures["moderation"]
    assert mod["states"]["infer"]["retries"] >= 1  # the scripted HTTP 500
    assert mod["sources"]["verdict_source"] == dict(
        Counter(r.context["verdict_source"] for r in SqliteStore(fleet.db).list(machine="moderation")))
    assert sum(mod["sources"]["verdict_source"].values()) == 6
    assert figures["router"]["by_reason"] == {"loop_limit": 2}
    assert any(e["kind"] == "loop_limit" for e in figures["router"]["edges"])


def test_stats_filters_by_machine_and_status(fleet: Fleet) -> None:
    assert set(cli_stats(fleet.db, "--machine", "router")) == {"router"}
    only_failed = cli_stats(fleet.db, "--status", "failed")
    assert set(only_failed) == {"router"} and only_failed["router"]["instances"] == 2
    assert cli_stats(fleet.db, "--machine", "nope") == {}


def test_stats_table_fits_80_columns(fleet: Fleet) -> None:
    result = CliRunner().invoke(app, ["stats", "--db", fleet.db], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.stdout.splitlines())) <= 80
    for header in ("state", "now", "entered", "steps", "retries", "fallbacks", "re-asks",
                   "errors", "p50", "p95", "max"):
        assert header in result.stdout


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0], 95) == 1.0
    data = [float(i) for i in range(1, 101)]
    assert (percentile(data, 50), percentile(data, 95), percentile(data, 100)) == (50.0, 95.0, 100.0)
    assert Dist.of([3, 1, 2]) == Dist(3, 6, 2.0, 2, 3, 3)
