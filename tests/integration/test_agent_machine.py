"""The reference agent machine (``machines/agent.py``, issue 23): its tools on the real
license texts, a scripted run through ``fsm run``, and (slow) the embedded model answering
"which of these licenses are copyleft?" with at least one tool call, within its budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MACHINES
from llm_fixtures import qwen_path  # noqa: F401  (fixture)

from fsm_engine import Engine, load_machine
from fsm_engine.store.records import TOOL

QUESTION = {"question": "which of these licenses are copyleft?"}


def _module():  # type: ignore[no-untyped-def]
    import importlib.util
    spec = importlib.util.spec_from_file_location("agent_ref", MACHINES / "agent.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_tools_read_the_real_license_texts_within_their_bounds() -> None:
    mod = _module()
    names = mod.list_files()
    assert "GPL-3" in names and "Apache-2.0" in names
    part = mod.read_file("GPL-3", offset=100)
    assert part["offset"] == 100 and len(part["text"]) == mod.READ_LIMIT
    assert part["length"] > 30000
    hits = mod.grep("copyleft")
    assert 1 <= len(hits) <= mod.GREP_LIMIT and all("copyleft" in h["line"].lower() for h in hits)
    with pytest.raises(ValueError, match="no license file"):
        mod.read_file("../../etc/passwd")


def _fsm(*args: str, cwd: Path, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsm_engine.cli", *args], cwd=cwd,
                          env={**os.environ, "COLUMNS": "200", **(env or {})},
                          capture_output=True, text=True, timeout=1800)


def test_fsm_run_with_a_scripted_model_answers_and_shows_the_tool_calls(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    lines = [{"tool_calls": [{"name": "grep", "arguments": {"pattern": "copyleft"}}],
              "prompt_tokens": 300, "completion_tokens": 20},
             {"tool_calls": [{"name": "grep", "arguments": {"pattern": XSS}}]},
             {"text": json.dumps({"final": {"answer": "GPL-2, GPL-3"}}),
              "prompt_tokens": 400, "completion_tokens": 15}]
    script.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "q.json").write_text(json.dumps(QUESTION))
    db = str(tmp_path / "fsm.db")
    ran = _fsm("run", str(MACHINES / "agent.py"), "--input", "q.json", "--db", db,
               "--llm", f"scripted:{script}", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    eng = Engine(db)
    try:
        [rec] = eng.store.list()
        assert (rec.state, rec.context["answer"]) == ("answered", "GPL-2, GPL-3")
        iid = rec.id
    finally:
        eng.close()
    shown = _fsm("history", iid, "--db", db, cwd=tmp_path).stdout
    assert "turn 1: grep" in shown and "call 1.1 grep" in shown
    stats = _fsm("stats", "--db", db, cwd=tmp_path).stdout
    assert "tools of agent" in stats and "grep" in stats
    dot = tmp_path / "i.dot"
    _fsm("diagram", str(MACHINES / "agent.py"), "--db", db, "--instance", iid, "-o", str(dot),
         cwd=tmp_path)
    assert "grep×2" in dot.read_text()
    _fsm("diagram", str(MACHINES / "agent.py"), "--db", db, "--stats", "-o", str(dot),
         cwd=tmp_path)
    assert "grep×2" in dot.read_text()
    _viewer_shows_the_calls(db, iid)


XSS = "<script>alert(1)</script>"


def _viewer_shows_the_calls(db: str, iid: str) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from fsm_engine import SqliteStore
    from fsm_engine.ui import create_app
    store = SqliteStore(db, readonly=True)
    try:
        page = TestClient(create_app(store)).get(f"/instances/{iid}").text
        assert page.count('class="history-row') == len(store.history(iid))
    finally:
        store.close()
    assert "call 1.1 grep" in page and "turn 2: grep" in page
    assert XSS not in page and "&lt;script&gt;" in page


@pytest.mark.model
@pytest.mark.slow
def test_the_embedded_model_answers_with_at_least_one_tool_call(
        tmp_path: Path, qwen_path: str) -> None:  # noqa: F811
    (tmp_path / "q.json").write_text(json.dumps(QUESTION))
    db = str(tmp_path / "fsm.db")
    ran = _fsm("run", str(MACHINES / "agent.py"), "--input", "q.json", "--db", db, cwd=tmp_path)
    assert "Traceback" not in ran.stderr, ran.stderr[-2000:]
    eng = Engine(db)
    try:
        [rec] = eng.store.list()
        rows = eng.store.history(rec.id)
        calls = [r for r in rows if r.kind == TOOL and r.detail.get("agent") == "call"]
        machine, _ = load_machine(str(MACHINES / "agent.py"))
        assert machine.token_budget is not None
        assert rec.tokens_used <= machine.token_budget
        assert len(calls) >= 1, [r.detail for r in rows]
        assert (rec.status, rec.state) == ("completed", "answered"), (rec.state, rec.reason)
        assert rec.context["answer"].strip()
    finally:
        eng.close()
