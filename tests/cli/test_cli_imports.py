"""``fsm --help``, ``fsm list`` and ``fsm show`` import nothing heavy (issue 9): no model
SDK, no llama.cpp, no web server, no tracing, not even sqlite-utils (migrations only)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from observe_fixtures import Fleet

HEAVY = ("openai", "llama_cpp", "sqlite_utils", "starlette", "uvicorn", "jinja2",
         "opentelemetry", "selenium", "httpx")


def imported(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fsm_engine.cli", *args],
                          capture_output=True, text=True, timeout=120)
    names = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", proc.stderr, re.M))
    return {n.split(".")[0] for n in names}, proc


@pytest.mark.parametrize("kind", ["help", "list", "show"])
def test_light_commands_import_nothing_heavy(fleet: Fleet, kind: str) -> None:
    args = {"help": ["--help"], "list": ["list", "--db", fleet.db],
            "show": ["show", fleet.ids["router"][0], "--db", fleet.db]}[kind]
    names, proc = imported(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fsm_engine" in names and len(names) > 10  # the probe saw the imports
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    if kind == "list":
        assert fleet.ids["router"][0] in proc.stdout
