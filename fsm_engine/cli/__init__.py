"""``fsm``: the command line, a thin layer over the public API.

Every user error (missing module, broken definition, unknown id, a file
that is not an fsm database, bad input) prints one line ``fsm: error: …`` on
stderr and exits with status 2; no traceback reaches the user.

A package of one module per topic, each registering its commands on ``common.app``;
they import ``common`` (and ``tables``, ``trust``) downward, never this package, so
there is no import circle.  Importing this package registers every command.
"""

from __future__ import annotations

import logging
import sys

import typer

from .. import telemetry_sdk
from ..errors import FsmError
from ..terminal import error_line, safe_logging

# isort: off
# registered in this order (``fsm --help`` lists them so): running, one instance, the rest
from . import run, instance, diagram  # noqa: F401
from . import fork, inspect, limits, migrate, observe, review, scale, stream, testkit  # noqa: F401
from . import schedule  # noqa: F401
from . import console  # noqa: F401 - cancel, pause, unpause, restart, send, review link
from . import api  # noqa: F401 - serve
# isort: on
from .common import DB, _fail, _find, _input_for, _live, _open, _print_json, app, exit_code, out  # noqa: F401,E501


def entry() -> None:
    """The ``fsm`` command's process entry point: ``main`` in a process that is the
    command's own (``collector.owned``: ``fsm run`` and ``fsm worker`` tune its garbage
    collector after start-up)."""
    from .. import collector
    collector.owned = True
    main()


def main() -> None:
    """Entry point: run the app, turning every ``FsmError`` into one line and exit 2."""
    if not logging.getLogger().handlers:  # warnings print as Python would, but made safe
        safe_logging()
    if telemetry_sdk.asked():  # OTEL_* variables: this process is ours to set up
        telemetry_sdk.configure()
    try:
        code = app(standalone_mode=False)
    except FsmError as exc:
        typer.echo(error_line(exc), err=True)
        sys.exit(2)
    except typer.TyperException as exc:  # usage errors: one line too, not a usage box
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            sys.exit(0)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        typer.echo(error_line(' '.join(str(message).split())), err=True)
        sys.exit(getattr(exc, "exit_code", 2) or 2)
    except typer.Abort:
        typer.echo("fsm: interrupted; unfinished instances continue with `fsm resume`", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("fsm: interrupted; unfinished instances continue with `fsm resume`", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "entry", "main"]
