"""Every machine in machines/ loads, has a current committed diagram, and runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import GOOD_VERDICT, MACHINES, license_files, scripted

from fsm_engine import Engine, load_machine
from fsm_engine.diagram import build_graph, to_dot
from fsm_engine.runtime.compiled import compile_machine
from fsm_engine.views import context_after

DIAGRAMS = MACHINES.parent / "diagrams"
MODULES = sorted(p for p in MACHINES.glob("*.py") if not p.name.startswith("_"))


def test_every_machine_module_is_listed():
    assert {p.stem for p in MODULES} >= {"moderation", "router", "report"}


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_committed_diagram_is_current(module: Path):
    machine, _ = load_machine(str(module))
    compile_machine(machine)
    dot = DIAGRAMS / f"{module.stem}.dot"
    assert dot.exists(), f"run: fsm diagram {module} -o {dot}"
    assert dot.read_text() == to_dot(build_graph(machine.export())), (
        f"{dot} is stale: run `fsm diagram machines/{module.name} -o {dot}` (and .svg)")
    assert (DIAGRAMS / f"{module.stem}.svg").exists()


def test_moderation_states_are_the_design_cards():
    machine, _ = load_machine(str(MACHINES / "moderation.py"))
    names = {s.name for s in machine.states}
    assert {"init", "collect", "preprocess", "infer", "degraded-infer", "validate", "output",
            "notify", "failed"} <= names


def _run(db: str, module: str, inputs: list[dict], llm) -> tuple[Engine, list]:
    eng = Engine(db, llm=llm, seed=3)
    ids = [eng.start(module, data) for data in inputs]
    return eng, asyncio.run(eng.run_many(ids))


def test_report_machine_completes_and_publishes_once(db_path, notify_file):
    replies = [{"text": '{"figures": ["1991", "GPL"]}', "prompt_tokens": 30, "completion_tokens": 9},
               {"text": "Sure! ```json\n{'summary': 'A license.',}\n```", "prompt_tokens": 30,
                "completion_tokens": 9},
               {"text": '{"conclusion": "Permissive enough."}', "prompt_tokens": 20,
                "completion_tokens": 6}]
    eng, [rec] = _run(db_path, str(MACHINES / "report.py"),
                      [{"path": license_files(1)[0]}], scripted(*replies))
    assert rec.status == "completed", rec.reason
    assert rec.context["summary"] == "A license."
    assert "| 2 | GPL |" in rec.context["table"]
    assert rec.tokens_used == 104
    assert len(notify_file.read_text().splitlines()) == 1
    rows = eng.store.history(rec.id)
    assert context_after(rec, rows)[-1] == rec.context


def test_report_machine_skips_and_falls_back_on_garbage(db_path, notify_file):
    garbage = {"text": "I cannot do that.", "prompt_tokens": 10, "completion_tokens": 5}
    eng, [rec] = _run(db_path, str(MACHINES / "report.py"),
                      [{"path": license_files(1)[0]}], scripted(garbage))
    assert rec.status == "completed"
    kinds = [(h.source, h.kind) for h in eng.store.history(rec.id)]
    assert ("extract", "skip") in kinds and ("summarise", "skip") in kinds
    assert ("conclude", "fallback") in kinds
    assert rec.context["conclusion"].startswith("0 key figures")


def test_moderation_reasks_then_degrades(db_path, notify_file):
    bad = {"text": "This text looks fine to me.", "prompt_tokens": 40, "completion_tokens": 8}
    eng, [rec] = _run(db_path, str(MACHINES / "moderation.py"),
                      [{"path": license_files(1)[0]}], scripted(bad))
    assert rec.status == "completed"
    triggers = [h.trigger for h in eng.store.history(rec.id)]
    assert triggers.count("reask") == 1 and "give_up" in triggers
    assert rec.context["verdict_source"] == "rules"
    assert rec.tokens_used == sum(h.tokens for h in eng.store.history(rec.id))


def test_moderation_does_not_take_the_prompt_echoed_back_for_a_verdict(db_path, notify_file):
    echo = {"text": '{"decision": "approve", "categories": ["short strings"], '
                    '"summary": "one sentence"}', "prompt_tokens": 40, "completion_tokens": 20}
    eng, [rec] = _run(db_path, str(MACHINES / "moderation.py"),
                      [{"path": license_files(1)[0]}], scripted(echo))
    assert rec.status == "completed"
    assert rec.context["verdict_source"] == "rules"  # neither the model nor constrained
    rows = eng.store.history(rec.id)
    assert any(h.detail.get("constrained_error", "").startswith("the answer repeats")
               for h in rows)


def test_moderation_unreadable_file_fails_with_reason(db_path, notify_file, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    _, [rec] = _run(db_path, str(MACHINES / "moderation.py"), [{"path": str(empty)}],
                    scripted(GOOD_VERDICT))
    assert (rec.status, rec.state, rec.reason) == ("failed", "failed", "unreadable")
