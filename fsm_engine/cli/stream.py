"""``fsm stream``: watch an instance live — its model replies as they are written, attempts
superseded, steps committed — until it is final.

Registered on ``common.app`` when the ``cli`` package is imported; the stream reader is
imported when the command runs.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from ..terminal import json_text, shown
from .common import DB, _find, _open, app


class _Text:
    """The human form: chunk text as it comes, other events on lines of their own."""

    def __init__(self) -> None:
        self.at_line_start = True

    def write(self, value: str) -> None:
        sys.stdout.write(shown(value))
        sys.stdout.flush()
        if value:
            self.at_line_start = value.endswith("\n")

    def line(self, value: str) -> None:
        self.write(("" if self.at_line_start else "\n") + value + "\n")

    def event(self, ev: Any) -> None:
        if ev.kind == "chunk":
            self.write(ev.text)
        elif ev.kind == "open":
            self.line(f"[step {ev.seq} attempt {ev.attempt}]")
        elif ev.kind == "superseded":
            by = f" by step {ev.by[0]} attempt {ev.by[1]}" if ev.by else ""
            self.line(f"[step {ev.seq} attempt {ev.attempt} superseded{by}]")
        elif ev.kind == "error":
            self.line(f"[step {ev.seq} attempt {ev.attempt} failed: {ev.info.get('error')}]")
        elif ev.kind == "end":
            self.line("")
        elif ev.kind == "step":
            self.line(f"[step {ev.seq}: {ev.source} --{ev.trigger}--> {ev.dest}]{_said(ev)}")
        elif ev.kind == "final":
            self.line(f"[{ev.status}]")


def _said(ev: Any) -> str:
    """`` = RESULT`` / `` failed: ERROR`` of an agent tool call's step (``""``: another's)."""
    if "result" in ev.info:
        return f" = {ev.info['result']}"
    return f" failed: {ev.info['error']}" if "error" in ev.info else ""


@app.command()
def stream(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
           db: str = DB,
           from_offset: str = typer.Option("0", "--from", metavar="N",
                                           help="Start at this stream offset (or an event's "
                                                "cursor N:S or N:S:K, to resume exactly)."),
           as_json: bool = typer.Option(False, "--json",
                                        help="One JSON object per event and line.")) -> None:
    """Watch an instance live: model replies as they are generated, attempts superseded,
    steps committed (trigger and destination; an agent's tool call with its result); exits
    when the instance is final."""
    from ..runtime.stream_read import parse_cursor
    parse_cursor(from_offset)  # a bad offset: one error line, before anything is read
    store = _open(db)
    try:
        watch(store, _find(store, instance_id).id, from_offset, as_json)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        store.close()


def watch(store: Any, instance_id: str, from_offset: str, as_json: bool) -> None:
    """Print the instance's events from ``from_offset`` until it is final."""
    from ..runtime.stream_read import events
    human = _Text()

    async def go() -> None:
        async for ev in events(store, instance_id, from_offset):
            if as_json:
                typer.echo(json_text(json.dumps(ev.as_json(), ensure_ascii=False)))
            else:
                human.event(ev)
    import asyncio
    asyncio.run(go())
