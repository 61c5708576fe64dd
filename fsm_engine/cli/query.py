"""The options of a query over instances (``fsm list``'s filters) and of the operator's
bulk actions, shared by ``cli.console`` and ``cli.fork``: plain typer options, importing
nothing of the package (so either module may use them without an import circle).
"""

from __future__ import annotations

import typer

AS = typer.Option(None, "--as", metavar="NAME", help="Who does it (default: $USER); "
                  "kept in the history row (detail.operator).")
YES = typer.Option(False, "--yes", help="With a query: apply it (default: a dry run).")
BATCH = typer.Option(500, "--batch", min=1, metavar="N",
                     help="With a query: instances per transaction.")
STATUS = typer.Option(None, "--status", metavar="STATUS", help="Query: this status (repeatable).")
MACHINE = typer.Option(None, "--machine", "-m", metavar="NAME", help="Query: this machine.")
STATE = typer.Option(None, "--state", metavar="STATE", help="Query: this state (repeatable).")
REASON = typer.Option(None, "--reason", metavar="REASON", help="Query: this reason (repeatable).")
TEXT = typer.Option(None, "--text", "-t", metavar="TEXT",
                    help="Query: id, context or last error contains this.")
SINCE = typer.Option(None, "--since", metavar="WHEN", help="Query: created at or after (ISO, 2h).")
UNTIL = typer.Option(None, "--until", metavar="WHEN", help="Query: created before (ISO, 2h).")
IDS = typer.Argument(None, help="Instance ids (or unambiguous prefixes); none with a query.")
CHILDREN = typer.Option(False, "--children",
                        help="Query: also fan-out children (default: top-level only).")
