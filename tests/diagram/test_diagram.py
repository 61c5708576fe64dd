"""Tests for fsm_engine.diagram: graph model, DOT (checked by the real ``dot``), Mermaid, render."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from typing import Any

import graphviz
import pytest

from fsm_engine import diagram
from fsm_engine.diagram import GraphvizNotFound, build_graph, render, to_dot, to_mermaid
from fsm_engine.diagram.model import node_ids

ODD_NAMES = ["审核 中", 'say "hi"', "a:b", "x\\y", "<b>&amp;</b>", "tail\\", "node", "a;b #1"]


def state(name: str, **fields: Any) -> dict[str, Any]:
    """One exported state with the export's defaults."""
    base = {"name": name, "final": False, "failure": False, "wait": False, "action": None,
            "timeout": None, "retry": None, "fallback": None, "side_effect": False,
            "skippable": False, "description": ""}
    return base | fields


def move(source: str, trigger: str, dest: str, conditions=(), unless=()) -> dict[str, Any]:
    """One exported transition."""
    return {"trigger": trigger, "source": source, "dest": dest,
            "conditions": list(conditions), "unless": list(unless)}


def moderation() -> dict[str, Any]:
    """A small moderation machine using every drawing feature."""
    return {
        "name": "moderation", "initial": "init", "max_transitions": 40, "token_budget": 4000,
        "states": [
            state("init", action="init_action"),
            state("classify", retry={"max_attempts": 3, "backoff": 1.0}, timeout=30.0,
                  fallback="degraded-infer"),
            state("degraded-infer", side_effect=True, skippable=True),
            state("review", wait=True),
            state("done", final=True),
            state("failed", final=True, failure=True),
        ],
        "transitions": [
            move("init", "next", "classify", ["has_text"], ["too_long"]),
            move("init", "next", "classify", ["has_text"], ["too_long"]),  # parallel duplicate
            move("init", "next", "failed", [], ["has_text"]),
            move("classify", "ok", "review", ["valid"], ["too_long"]),
            move("classify", "ok", "review", ["valid", "cheap"]),
            move("classify", "fallback", "degraded-infer"),
            move("classify", "budget_exhausted", "failed"),
            move("classify", "retry", "classify"),
            move("degraded-infer", "ok", "review"),
            move("review", "approve", "done"),
        ],
    }


def run_overlay() -> dict[str, Any]:
    """An instance that retried twice, went to review, then was force-failed."""
    return {"instance_id": "inst-7", "state": "failed", "status": "failed", "history": [
        {"seq": 1, "source": "init", "dest": "classify", "trigger": "next"},
        {"seq": 2, "source": "classify", "dest": "classify", "trigger": "retry"},
        {"seq": 3, "source": "classify", "dest": "classify", "trigger": "retry"},
        {"seq": 4, "source": "classify", "dest": "review", "trigger": "ok"},
        {"seq": 5, "source": "review", "dest": "failed", "trigger": "fail"},
    ]}


def odd_machine() -> dict[str, Any]:
    """A chain through states whose names are hostile to DOT, SVG and Mermaid."""
    names = ["start", *ODD_NAMES, "end: ok"]
    states = [state(n) for n in names[:-1]] + [state(names[-1], final=True)]
    hops = [move(a, f"go: {i}; \"{b}\"", b) for i, (a, b) in enumerate(zip(names, names[1:], strict=False))]
    return {"name": 'odd "machine"\\', "initial": "start", "states": states, "transitions": hops}


def laid_out(graph: diagram.Graph) -> tuple[dict[str, dict], list[dict]]:
    """Run the real ``dot -Tjson``: nodes by id, and edges with tail/head ids, as dot parsed them."""
    data = json.loads(graphviz.Source(to_dot(graph)).pipe(format="json"))
    objects = {o["_gvid"]: o for o in data["objects"]}
    edges = [e | {"tail": objects[e["tail"]]["name"], "head": objects[e["head"]]["name"]}
             for e in data["edges"]]
    return {o["name"]: o for o in objects.values()}, edges


def edge_between(graph: diagram.Graph, source: str, dest: str, label_start: str) -> dict:
    """The single laid-out edge from ``source`` to ``dest`` whose label starts as given."""
    ids = node_ids(graph)
    _, edges = laid_out(graph)
    found = [e for e in edges if (e["tail"], e["head"]) == (ids[source], ids[dest])
             and e.get("label", "").startswith(label_start)]
    assert len(found) == 1, found
    return found[0]


def svg_texts(graph: diagram.Graph) -> list[str]:
    """The text lines of the SVG drawn by the real ``dot -Tsvg`` (XML entities decoded)."""
    svg = graphviz.Source(to_dot(graph)).pipe(format="svg")
    root = ET.fromstring(svg)
    return ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def mermaid_unescape(text: str) -> str:
    """Decode Mermaid entity codes (``#58;``, ``#quot;``) the way Mermaid shows them."""
    return re.sub(r"#(\w+);", lambda m: html.unescape(
        f"&#{m[1]};" if m[1].isdigit() else f"&{m[1]};"), text)


def test_node_kinds_and_policy_notes() -> None:
    graph = build_graph(moderation())
    kinds = {n.name: n.kind for n in graph.nodes}
    assert kinds == {"init": "initial", "classify": "normal", "degraded-infer": "normal",
                     "review": "wait", "done": "final", "failed": "failure"}
    assert graph.node("classify").notes == ("retry×3", "timeout 30s", "fallback → degraded-infer")
    assert graph.node("degraded-infer").notes == ("side effect", "skippable")
    assert graph.initial == "init" and graph.overlay_id is None
    assert graph.notes == ("≤40 transitions", "budget 4000 tokens")


def test_labels_show_guards_and_parallel_edges_merge() -> None:
    graph = build_graph(moderation())
    labels = [(e.source, e.dest, e.label) for e in graph.edges]
    assert labels.count(("init", "classify", "next [has_text, !too_long]")) == 1
    assert ("init", "failed", "next [!has_text]") in labels
    # same move, different guards: two edges
    assert ("classify", "review", "ok [valid, !too_long]") in labels
    assert ("classify", "review", "ok [valid, cheap]") in labels
    assert len(graph.edges) == 9


def test_edge_kinds_from_trigger() -> None:
    kinds = {e.label: e.kind for e in build_graph(moderation()).edges}
    assert kinds["fallback"] == "fallback"
    assert kinds["budget_exhausted"] == "budget"
    assert kinds["approve"] == "normal"


def test_overlay_counts_visits_taken_and_forced() -> None:
    graph = build_graph(moderation(), run_overlay())
    assert graph.overlay_id == "inst-7" and graph.status == "failed"
    visits = {n.name: n.visits for n in graph.nodes}
    assert visits == {"init": 1, "classify": 3, "degraded-infer": 0, "review": 1,
                      "done": 0, "failed": 1}
    assert [n.name for n in graph.nodes if n.current] == ["failed"]
    taken = {(e.source, e.dest, e.label): e.taken for e in graph.edges}
    assert taken[("classify", "classify", "retry")] == 2
    assert taken[("init", "classify", "next [has_text, !too_long]")] == 1
    assert taken[("review", "done", "approve")] == 0
    forced = [e for e in graph.edges if e.kind == "forced"]
    assert [(e.source, e.dest, e.label, e.taken) for e in forced] == [
        ("review", "failed", "fail", 1)]


def test_overlay_with_state_missing_from_definition_adds_node() -> None:
    overlay = {"instance_id": "x", "state": "ghost", "status": "running",
               "history": [{"seq": 1, "source": "init", "dest": "ghost", "trigger": "jump"}]}
    graph = build_graph(moderation(), overlay)
    ghost = graph.node("ghost")
    assert ghost.current and ghost.visits == 1 and ghost.notes == ("not in definition",)
    assert "ghost" in svg_texts(graph)


def test_minimal_overlay_marks_start_state() -> None:
    graph = build_graph(moderation(), {"state": "init", "status": "running", "history": []})
    assert graph.overlay_id == "" and graph.node("init").visits == 1
    assert graph.node("init").current and not any(e.taken for e in graph.edges)
    nodes, _ = laid_out(graph)
    assert "bold" in nodes[node_ids(graph)["init"]]["style"]


def test_dot_shapes_and_colours_as_parsed_by_dot() -> None:
    graph = build_graph(moderation())
    ids = node_ids(graph)
    nodes, edges = laid_out(graph)
    assert nodes[ids["done"]]["shape"] == "doublecircle"
    assert nodes[ids["failed"]]["shape"] == "doublecircle"
    assert nodes[ids["failed"]]["color"] == "#c0392b"
    assert "dashed" in nodes[ids["review"]]["style"]
    start = [e for e in edges if e["tail"] == "__start__"]
    assert [e["head"] for e in start] == [ids["init"]]
    assert nodes["__start__"]["style"] == "invis"
    fallback = edge_between(graph, "classify", "degraded-infer", "fallback")
    assert (fallback["style"], fallback["color"]) == ("dashed", "#e67e22")


def test_dot_overlay_taken_twice_current_and_forced() -> None:
    graph = build_graph(moderation(), run_overlay())
    nodes, _ = laid_out(graph)
    retry = edge_between(graph, "classify", "classify", "retry")
    assert retry["label"] == "retry ×2" and float(retry["penwidth"]) > 1
    untaken = edge_between(graph, "review", "done", "approve")
    assert untaken["label"] == "approve" and untaken["color"] == "#b0b0b0"
    forced = edge_between(graph, "review", "failed", "fail")
    assert (forced["label"], forced["style"], forced["color"]) == ("fail ×1", "dashed", "#c0392b")
    current = nodes[node_ids(graph)["failed"]]
    assert "bold" in current["style"] and current["penwidth"] == "3"
    visited = nodes[node_ids(graph)["classify"]]
    assert "filled" in visited["style"]
    assert "filled" not in nodes[node_ids(graph)["done"]].get("style", "")


def test_dot_is_deterministic() -> None:
    first = to_dot(build_graph(moderation(), run_overlay()))
    second = to_dot(build_graph(moderation(), run_overlay()))
    assert first == second
    assert to_mermaid(build_graph(odd_machine())) == to_mermaid(build_graph(odd_machine()))


def test_odd_state_names_render_in_svg() -> None:
    graph = build_graph(odd_machine())
    texts = svg_texts(graph)
    for name in ODD_NAMES + ["end: ok"]:
        assert name in texts, name
    assert 'go: 0; "审核 中"' in texts
    assert 'odd "machine"\\' in texts


def test_odd_state_names_are_never_dot_ids() -> None:
    source = to_dot(build_graph(odd_machine()))
    edge_lines = [line.strip() for line in source.splitlines() if "->" in line]
    assert all(re.match(r"^(s\d+|__start__) -> s\d+( \[|$)", line) for line in edge_lines)


def test_mermaid_structure() -> None:
    text = to_mermaid(build_graph(moderation()))
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "stateDiagram-v2"
    ids = node_ids(build_graph(moderation()))
    assert f"[*] --> {ids['init']}" in lines
    assert f"{ids['done']} --> [*]" in lines and f"{ids['failed']} --> [*]" in lines
    assert f"{ids['init']} --> {ids['classify']} : next [has_text, !too_long]" in lines
    assert f"{ids['classify']} : retry×3" in lines


def test_mermaid_odd_names_use_safe_ids_and_escaped_text() -> None:
    text = to_mermaid(build_graph(odd_machine()))
    declared = re.findall(r'^    state "([^"\n]*)" as (\S+)$', text, re.M)
    shown = {mermaid_unescape(label) for label, _ in declared}
    assert set(ODD_NAMES) | {"start", "end: ok"} == shown
    assert all(re.fullmatch(r"s\d+", sid) for _, sid in declared)
    for line in text.splitlines():
        if "-->" in line:
            ends, _, label = line.partition(" : ")
            assert re.fullmatch(r"    (\[\*\]|s\d+) --> (\[\*\]|s\d+)", ends), line
            bare = re.sub(r"#\w+;", "", label)  # what is left once entity codes are removed
            assert ":" not in bare and ";" not in bare and '"' not in bare, line
    assert ' : go#58; 0#59; #quot;审核 中#quot;' in text
    assert mermaid_unescape('go#58; 0#59; #quot;审核 中#quot;') == 'go: 0; "审核 中"'


def test_mermaid_overlay_classes() -> None:
    graph = build_graph(moderation(), run_overlay())
    ids = node_ids(graph)
    lines = [line.strip() for line in to_mermaid(graph).splitlines()]
    assert f"class {ids['failed']} current" in lines
    visited = next(line for line in lines if line.endswith(" visited") and line.startswith("class "))
    assert set(visited.split()[1].split(",")) == {ids[n] for n in
                                                  ("init", "classify", "review", "failed")}
    assert f"{ids['classify']} --> {ids['classify']} : retry ×2" in lines
    assert f"{ids['review']} --> {ids['failed']} : fail (forced) ×1" in lines


def test_render_formats(tmp_path) -> None:
    graph = build_graph(moderation(), run_overlay())
    for ext in ("dot", "svg", "png", "mmd"):
        render(graph, str(tmp_path / f"m.{ext}"))
    assert (tmp_path / "m.dot").read_text(encoding="utf-8") == to_dot(graph)
    assert (tmp_path / "m.mmd").read_text(encoding="utf-8") == to_mermaid(graph)
    assert (tmp_path / "m.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    svg = ET.parse(tmp_path / "m.svg").getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"


def test_render_unknown_extension(tmp_path) -> None:
    target = tmp_path / "m.jpeg"
    with pytest.raises(ValueError, match=r"unknown extension '\.jpeg'.*\.svg"):
        render(build_graph(moderation()), str(target))
    assert not target.exists()


def test_render_without_dot_binary(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GraphvizNotFound, match="apt-get install graphviz"):
        render(build_graph(moderation()), str(tmp_path / "m.svg"))
    render(build_graph(moderation()), str(tmp_path / "m.dot"))  # source needs no binary
    assert (tmp_path / "m.dot").exists()


def test_public_api() -> None:
    assert {"build_graph", "to_dot", "to_mermaid", "render"} <= set(diagram.__all__)
    assert all(hasattr(diagram, name) for name in diagram.__all__)

def test_instance_overlay_figures_equal_the_store(fleet, tmp_path) -> None:
    """``fsm diagram --instance``: per state, attempts (steps leaving it + failed attempts),
    tokens (the same, billed) and a takeover line where another worker adopted it."""
    from collections import Counter

    from typer.testing import CliRunner

    from fsm_engine import SqliteStore
    from fsm_engine.cli import app
    from fsm_engine.diagram.overlays import instance_overlay
    from fsm_engine.store.records import HistoryRow

    store = SqliteStore(fleet.db, readonly=True)
    try:
        rec = next(r for r in store.list(machine="moderation") if store.attempts(r.id))
        history, attempts = store.history(rec.id), store.attempts(rec.id)
    finally:
        store.close()
    tries = Counter(h.source for h in history) + Counter(a.state for a in attempts)
    tokens: Counter[str] = Counter()
    for h in history:
        tokens[h.source] += h.tokens
    for a in attempts:
        tokens[a.state] += a.tokens
    figures = instance_overlay(rec, history, attempts)["figures"]
    for state, n in tries.items():
        line = figures[state][0]
        assert line.startswith(f"{n} attempt{'s' * (n != 1)} · "), (state, line)
        assert line.endswith(f" · {tokens[state]} tok") if tokens[state] else " tok" not in line
    assert any(a.state in figures and tries[a.state] > 1 for a in attempts)  # a retried state
    out = tmp_path / "i.dot"
    result = CliRunner().invoke(app, ["diagram", str(rec.module), "-o", str(out), "--instance",
                                      rec.id, "--db", fleet.db])
    assert result.exit_code == 0, result.output
    dot = out.read_text(encoding="utf-8")
    assert all(f"{n} attempt" in dot for n in tries.values())
    # a takeover is a figure of the state it happened in, not an attempt or a move
    where = history[-1].source  # taken over there, before its last step
    taken = HistoryRow(rec.id, 0, where, where, "recovery", history[-2].at, kind="recovery",
                       detail={"recovery": {}})
    again = instance_overlay(rec, [*history[:-1], taken, history[-1]], attempts)
    assert again["figures"][where] == [figures[where][0], "1 takeover"]
    assert again["history"] == instance_overlay(rec, history, attempts)["history"]
