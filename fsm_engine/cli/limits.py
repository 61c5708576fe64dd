"""``fsm limits``: show or set the fleet's queue, partition and rate limits in the store.

Every ``fsm worker`` of the store reads them again within ``runtime.fleet.limits.REFRESH_S``
seconds and obeys them (its own flags can only tighten them); see ``runtime.fleet.limits``.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from .common import DB, _fail, _open, _print_json, app, out


@app.command()
def limits(db: str | None = DB,
           queue_limit: list[str] = typer.Option(
               [], "--queue-limit", metavar="QUEUE=N|none,…",
               help="Most instances of a queue leased at once over all workers (none: remove)."),
           partition_limit: str | None = typer.Option(
               None, "--partition-limit", metavar="N|none",
               help="Most instances of one partition key leased at once (none: remove)."),
           rate_limit: list[str] = typer.Option(
               [], "--rate-limit", metavar="MODEL=rpm:N,tpm:N[,window:S]|none",
               help="A model's shared rate limit (MODEL: a --llm name, or default)."),
           clear: bool = typer.Option(False, "--clear", help="Remove every stored limit."),
           as_json: bool = typer.Option(False, "--json", help="Print the limits as JSON.")) -> None:
    """Show the fleet's limits; with options, change them (every worker obeys within ~2 s)."""
    from ..runtime.fleet import limits as fleet
    queues = fleet.parse_queue_limits(queue_limit)
    rates = fleet.parse_rate_limits(rate_limit)
    partition = fleet.parse_partition_limit(partition_limit)
    changing = bool(queues or rates or clear) or partition != "keep"
    store = _open(db, create=changing)
    try:
        # --clear starts afresh without reading: it is also the way out of an unusable value
        current = fleet.FleetLimits() if clear else _stored(store)
        if changing:
            current = current.changed(queue_limits=queues, partition_limit=partition,
                                      rate_limits=rates)
            store.put_limits(current.to_json() or None)
    finally:
        store.close()
    if as_json:
        _print_json(current.to_json())
    else:
        _show(current)


def _stored(store: Any) -> Any:
    """The stored limits; an unusable value is one error line that names the way out."""
    from ..errors import StoreError
    from ..runtime.fleet import limits as fleet
    try:
        return fleet.FleetLimits.from_json(store.get_limits())
    except StoreError as exc:
        _fail(f"{exc} (replace them: fsm limits --clear [--queue-limit …])")


def _show(limits: Any) -> None:
    if limits.empty:
        out.print("no fleet limits (set one: fsm limits --queue-limit llm=8)")
        return
    table = Table(title="fleet limits (every worker of this store obeys them)")
    for col in ("limit", "of", "value"):
        table.add_column(col)
    for queue, n in sorted(limits.queue_limits.items()):
        table.add_row("queue", queue, f"{n} leased at once")
    if limits.partition_limit is not None:
        table.add_row("partition", "each key", f"{limits.partition_limit} leased at once")
    for name, r in sorted(limits.rate_limits.items()):
        parts = [f"{r.rpm} calls" if r.rpm else "", f"{r.tpm} tokens" if r.tpm else ""]
        table.add_row("rate", "default" if name == "*" else name,
                      f"{' + '.join(p for p in parts if p)} per {r.window_s:g}s")
    out.print(table)
