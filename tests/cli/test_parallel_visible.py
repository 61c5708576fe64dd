"""A family in the CLI and the diagram: ``fsm list`` top-level by default, ``--children``,
``--family``; ``fsm show --json`` / ``fsm history`` of a parent list its children and their
final states; ``fsm diagram --instance`` draws the fan-out as a cluster holding the branch
machine, with the branches that succeeded, failed, were skipped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import parallel_machines as pm
import pytest
from typer.testing import CliRunner

from fsm_engine import Engine
from fsm_engine.cli import app

MACHINES = str(Path(pm.__file__))


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> tuple[str, str, str]:
    """(db, parent id, another top-level instance's id): a Map of three, one failing."""
    db = str(tmp_path_factory.mktemp("family") / "fsm.db")
    engine = Engine(db)
    iid = engine.start(pm.fan_completed, {"words": ["a", "fail", "c"]})
    assert asyncio.run(engine.run(iid)).state == "done"
    other = engine.start(pm.fan_completed, {"words": []})
    asyncio.run(engine.run(other))
    engine.close()
    return db, iid, other


def test_list_shows_top_level_instances_unless_asked(family) -> None:
    db, iid, other = family
    ids = lambda *a: [r["id"] for r in json.loads(invoke("list", "--db", db, "--json", *a))]  # noqa: E731
    assert ids() == [iid, other]
    assert ids("--children") == [iid, f"{iid}.1.0", f"{iid}.1.1", f"{iid}.1.2", other]
    assert ids("--family", iid) == [iid, f"{iid}.1.0", f"{iid}.1.1", f"{iid}.1.2"]


def test_show_and_history_of_a_parent_list_its_children(family) -> None:
    db, iid, _ = family
    shown = json.loads(invoke("show", iid, "--db", db, "--json"))
    assert [(k["branch"], k["state"], k["status"]) for k in shown["children"]] == \
        [("0", "done", "completed"), ("1", "failed", "failed"), ("2", "done", "completed")]
    text = invoke("history", iid, "--db", db)
    assert "children (3)" in text and f"{iid}.1.1" in text and "failed" in text
    assert "children" not in json.loads(invoke("show", f"{iid}.1.0", "--db", db, "--json"))


def test_the_diagram_draws_the_fan_out_as_a_cluster_with_its_branch_counts(family) -> None:
    db, iid, _ = family
    dot = invoke("diagram", MACHINES + ":fan_completed", "--instance", iid, "--db", db)
    assert "subgraph cluster_" in dot  # the fan-out state and, inside, the branch machine
    assert "2 succeeded · 1 failed · 0 skipped" in dot
