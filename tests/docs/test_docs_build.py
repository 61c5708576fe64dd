"""The documentation site (issue 40): it builds with ``mkdocs build --strict``, its CLI
reference holds every ``fsm`` command and option, its API reference every name of
``fsm_engine.__all__``, and every capability has a how-to page whose code runs
(``tests/integration/test_readme.py`` runs it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT
from doc_blocks import blocks

import fsm_engine

DOCS = ROOT / "docs"
#: Each capability and its how-to page (a later capability adds its line and its page).
CAPABILITIES = {
    "structured output and repair": "how-to/structured-output.md",
    "budgets and the loop cap": "how-to/budgets.md",
    "side effects and the outbox": "how-to/side-effects.md",
    "fan-out, Map and DAG": "how-to/fan-out.md",
    "human review": "how-to/human-review.md",
    "timers": "how-to/timers.md",
    "streaming": "how-to/streaming.md",
    "agent states": "how-to/agent-states.md",
    "workers on PostgreSQL, queues and limits": "how-to/workers.md",
    "schedules": "how-to/schedules.md",
    "fork, rerun and replay": "how-to/fork-rerun-replay.md",
    "versions and migrations": "how-to/versions.md",
    "testing machines": "how-to/testing.md",
    "the viewer and the console": "how-to/viewer.md",
    "the HTTP API for other services": "how-to/http-api.md",
    "telemetry": "how-to/telemetry.md",
    "choosing a model": "how-to/models.md",
    "starting instances: keys, delays, debounce, priority": "how-to/starting.md",
}


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _app_commands() -> dict[str, list[str]]:
    """Every command of the typer app, walked here on its own, with its option names."""
    import typer.main

    from fsm_engine.cli import app

    found: dict[str, list[str]] = {}

    def walk(group, prefix: str) -> None:
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                walk(cmd, f"{prefix} {name}")
            else:
                found[f"{prefix} {name}"] = [o for p in cmd.params for o in getattr(p, "opts", [])
                                             if o.startswith("-")]

    walk(typer.main.get_command(app), "fsm")
    return found


def test_the_cli_reference_holds_every_command_and_option():
    reference = _hooks().cli_reference()
    sections = dict(re.findall(r"^## `(fsm [^`]+)`\n(.*?)(?=^## |\Z)", reference, re.S | re.M))
    commands = _app_commands()
    assert len(commands) > 30 and "fsm review decide" in commands
    assert set(sections) == set(commands)
    for name, options in commands.items():
        missing = [o for o in options if f"`{o}`" not in sections[name]]
        assert not missing, f"{name}: {missing}"


def test_the_api_reference_names_every_public_name():
    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    shown = re.findall(r"^::: fsm_engine\.(\w+)$", page, re.M)
    assert sorted(shown) == sorted(fsm_engine.__all__)


def test_every_capability_has_a_how_to_page_whose_code_runs():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for capability, page in CAPABILITIES.items():
        text = (DOCS / page).read_text(encoding="utf-8")
        assert f": {page}\n" in nav, f"{capability}: {page} is not in mkdocs.yml's nav"
        executed = [b for b in blocks(text) if b.runs and "file" not in b.marks]
        assert executed, f"{capability}: {page} has no block the tests run"
    pages = {str(p.relative_to(DOCS)) for p in (DOCS / "how-to").glob("*.md")}
    assert pages == set(CAPABILITIES.values())


def test_the_environment_reference_names_every_variable_the_code_reads():
    """Every ``FSM_*`` name in the package and the reference machines is on the page (a prefix
    such as ``FSM_LLM_<NAME>`` stands for its family)."""
    page = (DOCS / "reference" / "environment.md").read_text(encoding="utf-8")
    sources = [*(ROOT / "fsm_engine").rglob("*.py"), *(ROOT / "machines").glob("*.py")]
    names = {n for path in sources for n in re.findall(r"\bFSM_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8"))}
    names -= {"FSM_MIGR"}  # the PostgreSQL migration lock's name, spelled out in a comment
    missing = [n for n in sorted(names) if f"`{n}`" not in page and not any(
        n.startswith(prefix) for prefix in re.findall(r"`(FSM_[A-Z_]+_)<", page))]
    assert not missing


def test_pages_show_only_diagrams_that_diagrams_holds():
    for page in DOCS.rglob("*.md"):
        for svg in re.findall(r"\]\((?:\.\./)*diagrams/([^)]+)\)", page.read_text(encoding="utf-8")):
            assert (ROOT / "diagrams" / svg).is_file(), f"{page.name}: diagrams/{svg}"


def test_an_included_section_that_is_gone_fails_the_build():
    with pytest.raises(ValueError, match="no section"):
        _hooks().on_page_markdown("<!-- include: bench/RESULTS.md#No such heading -->", None, None, None)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for package in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(package, reason="the [docs] extra is not installed")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.mark.slow
def test_the_site_builds_strict_with_every_command_and_name(site: Path):
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for name in _app_commands():
        assert f"<code>{name}</code>" in cli, name
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    missing = [n for n in fsm_engine.__all__ if f'id="fsm_engine.{n}"' not in api]
    assert not missing
    performance = (site / "explanation" / "performance" / "index.html").read_text(encoding="utf-8")
    assert "W3 zero completed steps executed twice" in performance  # included from bench/RESULTS.md
    assert (site / "diagrams" / "moderation.svg").read_bytes() == (ROOT / "diagrams" / "moderation.svg").read_bytes()
    for page in CAPABILITIES.values():
        assert (site / page.removesuffix(".md") / "index.html").is_file(), page
