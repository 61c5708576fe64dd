"""What every ``fsm`` command shares: the typer app, the ``--db`` option, the one-line
error, opening a store or an engine, finding an instance by id prefix, reading an input.

Command modules (``cli/*.py``) import this module, never each other's or the package's;
it imports the engine and the store inside the functions that need them, so ``fsm --help``
and ``fsm list`` start without the runtime (``tests/cli/test_cli_imports.py``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from .. import json_input
from ..errors import FsmError, InstanceNotFound, InvalidInput
from ..terminal import console, error_line, json_text, shown
from .trust import MACHINES, refuse_untrusted, trusting

if TYPE_CHECKING:
    from ..runtime import Engine
    from ..store import Store

__all__ = ["app", "out", "DB", "MACHINES", "trusting", "refuse_untrusted", "_print_json",
           "_fail", "_open", "_engine", "_new_engine", "_find", "_input_for", "_live", "exit_code"]

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Durable finite state machines for LLM workflows.")
out = console()  # no markup, stored text shown safely (``terminal``)
DB = typer.Option(None, "--db", show_default=False,
                  help="Store: a SQLite file, sqlite:///REL.db or sqlite:////ABS.db, or postgresql://… "
                       "(default: $FSM_DB, else fsm.db).")
#: ``--allowed-host`` of the commands that serve HTTP (``fsm ui``, ``fsm serve``).
ALLOWED_HOST = typer.Option(
    None, "--allowed-host", metavar="NAME[:PORT]",
    help="Also serve requests whose Host is this name (repeatable; default: only "
         "loopback names and the bound address, with its port).")



def _version(value: bool) -> None:
    if value:
        from .. import __version__
        typer.echo(f"fsm_engine {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Durable finite state machines for LLM workflows."""


def _print_json(data: Any) -> None:
    """Strict JSON on stdout (a database written before values were checked may hold a
    bare NaN: it is printed as the string ``"NaN"``, never as a non-standard token)."""
    try:
        text = json.dumps(data, ensure_ascii=False, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), ensure_ascii=False, indent=2, allow_nan=False)
    typer.echo(json_text(text))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _fail(msg: str) -> NoReturn:
    typer.echo(error_line(msg), err=True)
    raise typer.Exit(2)


def _open(db: str | None, *, create: bool = False) -> Store:
    """The store ``db`` names (``store_url``); only ``fsm run``/``start``/``worker``/``serve``
    (``create``) may start a new one.  An older schema is migrated forward on open."""
    from ..store import open_store, store_url
    return open_store(store_url(db), create=create)


def _engine(db: str | None, *, llm: list[str] | None = None, faults: str | None = None,
            seed: int | None = None, create: bool = False,
            machines: Sequence[str] = (), models: str = "declared") -> Engine:
    """An engine on ``db`` with the selected providers by model name (local ones load
    lazily) and the ``machines`` modules loaded (``trusting``).  ``models``: how its
    machine calls models (``CompiledMachine.model_use``): ``"none"`` builds no provider at
    all, ``"maybe"`` one that cannot be set up as ``Unavailable`` (the state calling it
    fails, naming why), ``"declared"`` demands them (``ClientError``); ``"deferred"``
    (machines not known yet: ``fsm resume``, ``fsm step``) builds them when the first
    machine that may call a model is registered, by that machine's use
    (``Models.defer``; a model named with ``--llm`` is demanded)."""
    from ..llm.select import providers_from_specs
    from ..runtime import Engine
    from ..runtime.fleet.rates import limits_from_specs
    providers = None if models in ("none", "deferred") else providers_from_specs(
        llm, faults=faults, seed=seed, lazy=models == "maybe")
    limits = limits_from_specs(None)  # FSM_RATE_LIMIT_<MODEL> (fsm worker: --rate-limit too)
    engine = Engine(_open(db, create=create), llm=providers, seed=seed, rate_limits=limits)
    if models == "deferred":
        engine.models.defer(lambda use: providers_from_specs(
            llm, faults=faults, seed=seed, lazy=use == "maybe" and not llm))
    return trusting(engine, machines)


def _new_engine(store: Store, **kwargs: Any) -> Engine:
    """``Engine(store, **kwargs)``, the runtime imported only by the commands that run one."""
    from ..runtime import Engine
    return Engine(store, **kwargs)


def _find(store: Store, instance_id: str) -> Any:
    """The instance with this id, or the only one whose id starts with it (like git)."""
    try:
        return store.get(instance_id)
    except InstanceNotFound:
        matches = [r for r in store.list() if r.id.startswith(instance_id)] if instance_id else []
        ids = {r.id for r in matches}  # a parent's prefix also starts its children's ids
        matches = [r for r in matches if r.parent_id not in ids]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise InvalidInput(f"id prefix {instance_id!r} matches {len(matches)} instances") from None
        raise


def _input_for(arg: str) -> dict[str, Any]:
    """A CLI input: a ``.json`` file is the input object; any other file is ``{"path": …}``."""
    name = shown(arg)
    if not os.path.exists(arg):
        raise InvalidInput(f"input file not found: {name}")
    if os.path.isdir(arg):
        raise InvalidInput(f"input {name} is a directory, not a file")
    if not os.path.isfile(arg):
        raise InvalidInput(f"input {name} is not a regular file")
    if arg.endswith(".json"):
        try:
            with open(arg, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise InvalidInput(f"cannot read JSON input {name}: {exc}") from None
        return json_input.parse_object(raw, f"JSON input {name}")
    return {"path": os.path.abspath(arg)}


def _live(store: Store) -> set[str]:
    """Ids of the live workers (to show instances of dead ones as ``orphaned``)."""
    import time as _time

    from ..runtime.fleet.liveness import live_ids
    return live_ids(store.workers(), _time.time(), 10.0)


def exit_code(records: list[Any]) -> int:
    """0 when every instance completed, 1 when any failed, was cancelled or stopped on an
    error, else 3 (some are not final: waiting, or left for ``fsm resume``)."""
    if any(isinstance(r, FsmError) or r.status in ("failed", "cancelled") for r in records):
        return 1
    return 0 if all(r.status == "completed" for r in records) else 3
