"""``fsm stream``: watch an instance live — its model replies as they are written, attempts
superseded, steps committed — until it is final.

Registered on :data:`fsm_engine.cli.app` when ``cli`` is imported; the stream reader is
imported when the command runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import typer

from .cli import DB, _find, _open, app
from .terminal import json_text, shown


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
            self.line(f"[step {ev.seq}: {ev.source} --{ev.trigger}--> {ev.dest}]")
        elif ev.kind == "final":
            self.line(f"[{ev.status}]")


@app.command()
def stream(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
           db: str = DB,
           from_offset: str = typer.Option("0", "--from", metavar="N",
                                           help="Start at this stream offset (or an event's "
                                                "cursor N:S, to resume exactly)."),
           as_json: bool = typer.Option(False, "--json",
                                        help="One JSON object per event and line.")) -> None:
    """Watch an instance live: model replies as they are generated, attempts superseded,
    steps committed (trigger and destination); exits when the instance is final."""
    from .runtime.stream_read import events, parse_cursor
    parse_cursor(from_offset)  # a bad offset: one error line, before anything is read
    store = _open(db)
    rec = _find(store, instance_id)
    human = _Text()

    async def watch() -> None:
        async for ev in events(store, rec.id, from_offset):
            if as_json:
                typer.echo(json_text(json.dumps(ev.as_json(), ensure_ascii=False)))
            else:
                human.event(ev)
    try:
        asyncio.run(watch())
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        store.close()
