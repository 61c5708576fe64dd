"""The README's and the documentation's code runs as written (issue 40).

The README's two Python blocks run with the model swapped for a scripted one; every page of
``docs/`` has its Python and shell blocks run in a folder of its own by ``doc_blocks`` (the
markers it reads are in its docstring), one test per page.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
from pathlib import Path

import pytest
from conftest import MACHINES, ROOT, scripted
from doc_blocks import blocks, is_slow, run_page

from fsm_engine.definition import fingerprint

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
#: The pages whose blocks are the docs' examples (the reference and explanation pages show
#: little code, and what they show runs too).
MAX_SKIPPED = 8


def test_readme_is_short_and_has_the_machine_and_the_run_example():
    assert README.count("\n") <= 300
    assert len(BLOCKS) >= 2
    assert "machine = Machine(" in BLOCKS[0] and "engine.run(" in BLOCKS[1]


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import fsm_engine.llm

    monkeypatch.chdir(tmp_path)
    replies = [{"text": "A haiku.\nto_review", "prompt_tokens": 9, "completion_tokens": 5},
               {"text": "accept", "prompt_tokens": 9, "completion_tokens": 1}]
    monkeypatch.setattr(fsm_engine.llm, "provider_from_spec", lambda spec: scripted(*replies))
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(BLOCKS[0], "README.md#machine", "exec"), namespace)
    exec(compile(BLOCKS[1], "README.md#run", "exec"), namespace)
    record = namespace["record"]
    assert (record.state, record.status, record.tokens_used) == ("done", "completed", 24)
    assert record.context["route"] == ["to_review", "accept"]


def test_readme_machine_is_the_router_its_diagram_draws():
    """The README shows machines/router.py's definition (same fingerprint) and its diagram."""
    namespace: dict = {"__name__": "readme_machine"}
    exec(compile(BLOCKS[0], "README.md#machine", "exec"), namespace)
    spec = importlib.util.spec_from_file_location("router_for_readme", MACHINES / "router.py")
    assert spec is not None and spec.loader is not None
    router = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(router)
    assert fingerprint(namespace["machine"]) == fingerprint(router.machine)
    assert "](diagrams/router.svg)" in README and (ROOT / "diagrams" / "router.svg").is_file()


def test_the_streamed_ask_without_a_loop_returns_the_reply_text(tmp_path: Path):
    """docs/how-to/streaming.md's ``ask_no_loop``: ``stream(...).text()`` is the reply's
    text, a str (issue 36: it was the Completion, read by the README as the text)."""
    from pydantic import BaseModel

    from fsm_engine import Engine, Machine, State, Step, Transition

    class Ctx(BaseModel):
        question: str
        answer: str = ""
    page = (DOCS / "how-to" / "streaming.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "ask_no_loop" in b)
    namespace: dict = {"__name__": "docs_stream", "Ctx": Ctx, "Step": Step}
    exec(compile(block, "docs/how-to/streaming.md#ask_no_loop", "exec"), namespace)
    machine = Machine(name="qa_streamed", context=Ctx, initial="ask",
                      states=[State("ask", action=namespace["ask_no_loop"]), State("done", final=True)],
                      transitions=[Transition("ok", "ask", "done")])
    llm = scripted({"text": "seven", "chunks": ["se", "ven"], "prompt_tokens": 9,
                    "completion_tokens": 2})
    engine = Engine(str(tmp_path / "fsm.db"), llm=llm)
    try:
        record = asyncio.run(engine.run(engine.start(machine, {"question": "Name a prime."})))
    finally:
        engine.close()
    assert (record.status, record.context["answer"]) == ("completed", "seven")


def test_readme_commands_are_the_ones_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ci:test-command" in ci
    assert README.count("<!-- ci:test-command -->") == 1
    assert README.count("<!-- ci:main-command -->") == 1
    for marker in ("ci:main-command", "ci:test-command"):
        assert re.search(rf"<!-- {marker} -->\n```bash\n[^\n]+\n```\n", README), marker


def test_readme_links_to_pages_that_exist():
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).is_file(), link


def test_skipped_blocks_say_why_and_are_few():
    skipped = [(page.name, b.line, b.marks["skip"]) for page in PAGES
               for b in blocks(page.read_text(encoding="utf-8")) if "skip" in b.marks]
    assert all(len(reason) >= 10 for _, _, reason in skipped), skipped
    assert len(skipped) <= MAX_SKIPPED, skipped


def test_the_block_reader_sees_markers_and_languages():
    text = ('<!-- docs: file=a.py -->\n```python title="a.py"\nx = 1\n```\n\n```text\nshown\n```\n'
            "<!-- docs: skip=needs a real model download -->\n```bash\nfsm run m.py\n```\n"
            "<!-- docs: exit=3 -->\n```bash\nexit 3\n```\n")
    found = blocks(text)
    assert [(b.lang, b.marks, b.runs) for b in found] == [
        ("python", {"file": "a.py"}, True), ("text", {}, False),
        ("bash", {"skip": "needs a real model download"}, False), ("bash", {"exit": "3"}, True)]
    assert found[0].body == "x = 1\n" and found[1].line == 6


def test_files_a_page_writes_are_named_to_the_reader():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for name, title in re.findall(r"<!-- docs: file=(\S+) -->\n```[\w-]*(.*)\n", text):
            assert title == f' title="{name}"', f"{page.name}: {name}"


def _page_param(page: Path):
    marks = [pytest.mark.slow] if is_slow(page.read_text(encoding="utf-8")) else []
    return pytest.param(page, id=str(page.relative_to(DOCS)), marks=marks)


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES])
def test_docs_page_code_runs(page: Path, tmp_path: Path):
    run_page(page, tmp_path)
