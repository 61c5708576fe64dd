"""MkDocs hooks: the pages that are generated from the code and the repository at build time.

- ``<!-- generated: cli -->`` in a page becomes the reference of every ``fsm`` command, read from
  the typer app (:func:`cli_reference`), so no command or option can be left out of it.
- ``<!-- include: PATH#HEADING -->`` becomes the section of ``PATH`` (relative to the repository)
  under the level-2 heading ``HEADING``, up to the next level-2 heading: the benchmark tables come
  from ``bench/RESULTS.md``, which ``bench/run.py`` writes.
- Every ``diagrams/*.svg`` is added to the site as ``diagrams/NAME.svg`` (``diagrams/`` is kept
  current by its test), so pages show the rendered diagrams, never a copy of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r"<!-- include: (?P<path>[^#]+)#(?P<heading>.+?) -->")


def _command_rows(cmd: Any, ctx: Any) -> list[str]:
    """One command's reference: usage, help, and a table of its arguments and options."""
    usage = re.sub(r"\{(\w+)\}", lambda m: m[1].upper(), cmd.get_usage(ctx).strip())
    lines = [f"```text\n{usage}\n```", "", (cmd.help or "").strip(), ""]
    params = [p for p in cmd.get_params(ctx) if p.name != "help"]
    if params:
        lines += ["| argument / option | type | default | what it does |", "|---|---|---|---|"]
    for param in params:
        if param.param_type_name == "argument":
            name = f"`{param.human_readable_name.upper()}`"
            text = getattr(param, "help", None) or ""
        else:
            name = " / ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
            text = param.help or ""
        default = param.default if not callable(param.default) else None
        shown = "" if default in (None, (), [], False) or param.is_flag and default is False else f"`{default}`"
        cell = " ".join(text.split())
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in (name, param.type.name, shown, cell)) + " |")
    return lines


def commands() -> list[tuple[str, Any, Any]]:
    """Every ``fsm`` command as (full name, click command, click context), in ``fsm --help`` order."""
    import typer.main

    from fsm_engine.cli import app

    root = typer.main.get_command(app)
    found: list[tuple[str, Any, Any]] = []

    def walk(group: Any, prefix: str, parent: Any) -> None:
        for name in group.list_commands(parent):
            cmd = group.get_command(parent, name)
            ctx = cmd.context_class(cmd, info_name=name, parent=parent)
            if hasattr(cmd, "list_commands"):  # a group (fsm review): its subcommands
                walk(cmd, f"{prefix} {name}", ctx)
            else:
                found.append((f"{prefix} {name}", cmd, ctx))

    walk(root, "fsm", root.context_class(root, info_name="fsm"))
    return found


def cli_reference() -> str:
    """The CLI reference in Markdown: a section per command, generated from the typer app."""
    out: list[str] = []
    for full, cmd, ctx in commands():
        out += [f"## `{full}`", "", *_command_rows(cmd, ctx), ""]
    return "\n".join(out)


def _section(path: str, heading: str) -> str:
    text = (ROOT / path).read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if match is None:
        raise ValueError(f"{path} has no section '## {heading}'")
    return match.group(1).strip()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the generated parts of a page."""
    if "<!-- generated: cli -->" in markdown:
        markdown = markdown.replace("<!-- generated: cli -->", cli_reference())
    return INCLUDE.sub(lambda m: _section(m["path"].strip(), m["heading"].strip()), markdown)


def on_files(files: Any, config: Any) -> Any:
    """Add the rendered diagrams of ``diagrams/`` to the site."""
    from mkdocs.structure.files import File

    for svg in sorted((ROOT / "diagrams").glob("*.svg")):
        files.append(File(f"diagrams/{svg.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
