"""Run a Markdown page's code blocks, as a reader would, in a folder of their own.

A page's fenced blocks run in order in one working folder (a copy of the repository's
``machines/`` in it, as in a checkout) and, for Python, one namespace:

- a ```` ```python ```` block is executed; a ```` ```bash ```` block runs in ``bash -e -o pipefail``
  with this interpreter's ``bin/`` first on ``PATH`` (so ``fsm`` is the tree under test) and must
  exit 0;
- ``<!-- docs: file=NAME -->`` just before a block writes the block to ``NAME`` instead (any
  language; a Python file is compiled, so a syntax error fails the page); the fence shows the
  name to the reader with ``title="NAME"`` after its language;
- ``<!-- docs: exit=N -->`` before a bash block: it must exit ``N``;
- ``<!-- docs: skip=REASON -->`` before a block: not run (the reason is required);
- ``<!-- docs: slow -->`` anywhere: the page's test is marked slow;
- any other block (``text``, ``json`` without ``file=``, ``mermaid``) is shown, not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FENCE = re.compile(r"(?:<!-- docs: (?P<marks>[^>]*?) -->\n)?^```(?P<lang>[\w-]*)(?: [^\n]*)?\n(?P<body>.*?)^```$",
                   re.S | re.M)
MARK = re.compile(r"(\w+)(?:=(.*?))?(?=\s+\w+=|\s*$)")


@dataclass
class Block:
    """One fenced block and what its marker asks."""

    lang: str
    body: str
    line: int
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        """True when the block is executed or written (not shown only, nor skipped)."""
        if "skip" in self.marks:
            return False
        return "file" in self.marks or self.lang in ("python", "bash")


def blocks(text: str) -> list[Block]:
    """The page's fenced blocks, in order, with their markers."""
    found = []
    for m in FENCE.finditer(text):
        marks = {k: (v or "").strip() for k, v in MARK.findall(m["marks"] or "")}
        found.append(Block(m["lang"], m["body"], text.count("\n", 0, m.start("lang")) + 1, marks))
    return found


def is_slow(text: str) -> bool:
    """True when the page marks itself slow."""
    return "<!-- docs: slow -->" in text


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSM_", "OPENAI_", "OTEL_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HOME"] = env.get("HOME", str(folder))
    env["COLUMNS"] = "100"
    return env


def run_page(page: Path, folder: Path, timeout: float = 120.0) -> int:
    """Run every block of ``page`` in ``folder``; raise AssertionError naming the first that fails.

    Returns how many blocks ran (written files included).
    """
    shutil.copytree(ROOT / "machines", folder / "machines", ignore=shutil.ignore_patterns("__pycache__"))
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")  # a real module: pydantic
    sys.modules[module.__name__] = module                             # resolves its classes' fields
    namespace = module.__dict__
    ran = 0
    old = Path.cwd()
    os.chdir(folder)
    try:
        for block in blocks(page.read_text(encoding="utf-8")):
            if not block.runs:
                continue
            where = f"{page.relative_to(ROOT)}:{block.line}"
            if "file" in block.marks:
                (folder / block.marks["file"]).write_text(block.body, encoding="utf-8")
                if block.marks["file"].endswith(".py"):
                    compile(block.body, where, "exec")
            elif block.lang == "python":
                exec(compile(block.body, where, "exec"), namespace)
            else:
                _run_bash(block, where, folder, timeout)
            ran += 1
    finally:
        os.chdir(old)
        sys.modules.pop(module.__name__, None)
    return ran


def _run_bash(block: Block, where: str, folder: Path, timeout: float) -> None:
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.body], cwd=folder, env=_env(folder),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    expected = int(block.marks.get("exit", "0"))
    assert proc.returncode == expected, (
        f"{where}: exit {proc.returncode}, expected {expected}\n{block.body}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
