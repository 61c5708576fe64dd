"""The fan-out reference machines (``machines/digest.py``, ``machines/screenshot.py``) end to
end: on the scripted model here, on the embedded model in the ``model`` tests."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MACHINES, license_files, scripted
from llm_fixtures import gemma_path  # noqa: F401  (fixture)

from fsm_engine import Engine

SCREEN = "[header: Acme] [button: 'Click here!!!'] [text: 'Buy now, limited offer'] [footer]"


def _family_tokens(eng: Engine, rec) -> int:
    """The parent's own history + attempts tokens, children counted through their joins."""
    return sum(h.tokens for h in eng.store.history(rec.id)) + \
        sum(a.tokens for a in eng.store.attempts(rec.id))


def _check(eng: Engine, rec) -> None:
    kids = eng.store.children(rec.id)
    assert kids and all(k.final for k in kids)
    assert _family_tokens(eng, rec) == rec.tokens_used
    joins = [h for h in eng.store.history(rec.id) if h.kind == "join"]
    assert len(joins) == 1 and joins[0].tokens == sum(k.tokens_used for k in kids)


def test_digest_maps_sections_and_composes(tmp_path) -> None:
    path = license_files(1)[0]
    note = {"text": '{"title": "Terms", "gist": "It grants rights."}', "prompt_tokens": 40,
            "completion_tokens": 12}
    eng = Engine(str(tmp_path / "fsm.db"), llm=scripted(note), seed=1)
    iid = eng.start(str(MACHINES / "digest.py"), {"path": path})
    rec = asyncio.run(eng.run(iid))
    assert rec.status == "completed", (rec.reason, rec.last_error)
    sections = rec.context["sections"]
    assert 1 <= len(sections) <= 4 and len(rec.context["notes"]) == len(sections)
    assert rec.context["digest"].count("Terms: It grants rights.") == len(sections)
    _check(eng, rec)
    assert rec.tokens_used == 52 * len(sections)


def test_screenshot_dag_runs_two_analyses_then_suggests(tmp_path) -> None:
    replies = [{"match": "Describe the layout",
                "text": '{"layout": "header, button, text", "issues": ["shouty button"]}',
                "prompt_tokens": 30, "completion_tokens": 10},
               {"match": "Judge the tone", "text": "not json at all", "prompt_tokens": 30, "completion_tokens": 5},
               {"match": "Suggest up to", "text": '{"suggestions": ["calmer button text"]}',
                "prompt_tokens": 30, "completion_tokens": 8}]
    eng = Engine(str(tmp_path / "fsm.db"), llm=scripted(*replies), seed=1)
    iid = eng.start(str(MACHINES / "screenshot.py"), {"screen": SCREEN})
    rec = asyncio.run(eng.run(iid))
    assert rec.status == "completed", (rec.reason, rec.last_error)
    assert rec.context["ui"]["issues"] == ["shouty button"]
    assert rec.context["copy_report"] == {"tone": "unknown", "issues": []}  # skipped
    assert rec.context["suggestions"] == ["calmer button text"]
    kids = {k.branch: k.status for k in eng.store.children(iid)}
    assert kids == {"analyze_ui": "completed", "analyze_copy": "failed"}
    _check(eng, rec)


@pytest.mark.model
@pytest.mark.slow
def test_both_reference_machines_on_the_embedded_model(tmp_path, gemma_path,  # noqa: F811
                                                       monkeypatch) -> None:
    from fsm_engine.llm import LocalLlama
    monkeypatch.setenv("FSM_DIGEST_SECTIONS", "1")  # one short section: CI time
    monkeypatch.setenv("FSM_DIGEST_SECTION_CHARS", "200")
    eng = Engine(str(tmp_path / "fsm.db"), llm=LocalLlama(gemma_path), seed=1)
    ids = [eng.start(str(MACHINES / "digest.py"), {"path": license_files(1)[0]}),
           eng.start(str(MACHINES / "screenshot.py"), {"screen": SCREEN})]
    for rec in asyncio.run(eng.run_many(ids)):
        assert rec.final and (rec.status == "completed" or rec.reason), (rec.status, rec.reason)
        assert rec.status == "completed", (rec.machine, rec.reason, rec.last_error)
        _check(eng, rec)
        assert rec.tokens_used > 0
