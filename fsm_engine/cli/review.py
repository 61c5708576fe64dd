"""``fsm review list|show|claim|decide``: the review queue from the terminal.

Registered on :data:`fsm_engine.cli.app` when ``cli`` is imported.  A refused
answer (stale, second, claimed by another, not offered, an invalid edit) is one
line ``fsm: error: …`` and exit 2, with nothing written.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from .. import json_input
from ..errors import InvalidInput
from ..terminal import shown
from ..views import when
from .common import DB, _new_engine, _open, _print_json, app, out
from .trust import MACHINES, trusting

if TYPE_CHECKING:
    from ..runtime import Engine

review_app = typer.Typer(no_args_is_help=True, help="The human review queue.")
app.add_typer(review_app, name="review")


def _engine(db: str | None, machines: list[str] | None = None) -> Engine:
    return trusting(_new_engine(_open(db), llm=None), machines or [])


def _value(field: str, text: str, annotation: Any = None) -> Any:
    """A ``--set`` value.  For a field of declared type ``annotation``, what pydantic makes
    of it as JSON, else as the text itself (``5`` is 5 for an ``int`` field and ``"5"`` for
    a ``str`` one; ``true`` is True for a ``bool``), in JSON form; with no type, or when
    neither fits (the update's validation then says why): JSON when it parses (``3``,
    ``true``, ``"x"``, ``[…]``), else text.  ``InvalidInput`` when it nests too deep
    (``json_input``), whatever the type."""
    from pydantic import PydanticUserError, TypeAdapter, ValidationError
    json_input.check_depth(text, f"--set {field}")  # too deep: refused, not read as text
    try:
        adapter = None if annotation is None else TypeAdapter(annotation)
    except PydanticUserError:  # a type only its model's config admits: read as untyped
        adapter = None
    if adapter is not None:
        for parse in (adapter.validate_json, adapter.validate_python):
            try:
                return adapter.dump_python(parse(text), mode="json")
            except (ValidationError, ValueError, RecursionError):
                continue
    try:
        return json_input.parse(text, f"--set {field}")
    except InvalidInput:
        return text


def _types(engine: Engine, instance_id: str) -> dict[str, Any]:
    """The declared type of each context field of instance ``instance_id``'s machine."""
    context = engine.registry.definition(engine.store.get(instance_id)).spec.context
    return {name: f.annotation for name, f in context.model_fields.items()}


def _update(sets: list[str], edit: str | None,
            types: dict[str, Any] | None = None) -> dict[str, Any]:
    """The context update of ``--edit FILE`` (a JSON object) and ``--set FIELD=VALUE``s,
    each value read as its field's type in ``types`` (``_value``).  ``InvalidInput``
    for a file that is not a JSON object, a ``--set`` that is not ``FIELD=VALUE``."""
    update: dict[str, Any] = {}
    if edit is not None:
        name = shown(edit)
        try:
            with open(edit, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise InvalidInput(f"cannot read file {name}: {exc.strerror or exc}") from None
        update = json_input.parse_object(raw, f"file {name}")
    for item in sets:
        field, eq, value = item.partition("=")
        if not eq or not field:
            raise InvalidInput(f"--set wants FIELD=VALUE, not {item!r}")
        update[field] = _value(field, value, (types or {}).get(field))
    return update


@review_app.command("list")
def list_(db: str | None = DB,
          machine: str | None = typer.Option(None, "--machine", help="Only this machine."),
          status: str = typer.Option("open", "--status", help="open, decided, closed (undecided) or all."),
          as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Review items across instances, oldest first (open ones by default)."""
    engine = _engine(db)
    try:
        items = engine.reviews(status=None if status == "all" else status, machine=machine)
    finally:
        engine.close()
    if as_json:
        _print_json([asdict(i) for i in items])
        return
    if not items:
        out.print("no review items")
        return
    table = Table(box=None, header_style="bold")
    for col in ("item", "instance"):
        table.add_column(col, no_wrap=True, min_width=12)
    for col in ("state", "status", "by", "due"):
        table.add_column(col)
    for i in items:
        table.add_row(i.id, i.instance_id, shown(i.state), i.status,
                      i.decided_by or i.claimed_by or "-", when(i.due_at) if i.due_at else "-")
    out.print(table)


@review_app.command()
def show(item: str = typer.Argument(..., help="Review item id (an unambiguous prefix works)."),
         db: str | None = DB,
         as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """One review item: its prompt, the fields shown, the choices and any decision."""
    engine = _engine(db)
    try:
        found = engine.review(item)
    finally:
        engine.close()
    if as_json:
        _print_json(asdict(found))
        return
    lines = [f"item      {found.id} ({found.status})",
             f"instance  {found.instance_id}  state {found.state!r} visit {found.visit}",
             f"prompt    {found.prompt}", f"choices   {', '.join(found.choices)}",
             f"editable  {', '.join(found.editable) or '-'}"]
    if found.due_at:
        lines.append(f"due       {when(found.due_at)} (then {found.on_timeout})")
    if found.claimed_by:
        lines.append(f"claimed   by {found.claimed_by} {when(found.claimed_at)}")
    for key, value in found.show.items():
        lines.append(f"  {key}: {json.dumps(value, ensure_ascii=False)}")
    if found.status == "closed":
        lines.append(f"closed    undecided by {found.decided_by} {when(found.decided_at)}: "
                     f"{found.note}")
    elif found.decided_by:
        lines.append(f"decided   {found.choice} by {found.decided_by} {when(found.decided_at)}"
                     + (f": {found.note}" if found.note else ""))
    for line in lines:
        typer.echo(shown(line))


@review_app.command()
def claim(item: str = typer.Argument(..., help="Review item id (an unambiguous prefix works)."),
          by: str = typer.Option(..., "--as", help="Who claims it."),
          db: str | None = DB) -> None:
    """Claim an item: decisions by anyone else are refused until it is decided."""
    engine = _engine(db)
    try:
        found = engine.claim_review(item, by)
    finally:
        engine.close()
    typer.echo(f"review {found.id} claimed by {found.claimed_by}")


@review_app.command()
def decide(item: str = typer.Argument(..., help="Review item id (an unambiguous prefix works)."),
           choice: str = typer.Argument(..., help="One of the item's choices."),
           by: str | None = typer.Option(None, "--as", help="Who decides (default: $USER)."),
           sets: list[str] = typer.Option([], "--set", help="Edit: FIELD=VALUE (JSON or text)."),
           edit: str | None = typer.Option(None, "--edit", help="Edit: a JSON object file."),
           note: str | None = typer.Option(None, "--note", help="Why (kept in the history)."),
           db: str | None = DB, machines: list[str] = MACHINES) -> None:
    """Decide an item; the instance continues with the next worker step (`fsm resume`,
    `fsm worker`)."""
    import os
    _update(sets, edit)  # a malformed --set or --edit: refused before the store is opened
    who = by or os.environ.get("USER") or "operator"
    engine = _engine(db, machines)
    try:
        found = engine.review(item)
        update = _update(sets, edit, _types(engine, found.instance_id) if sets else None)
        rec = engine.decide(found, choice, by=who, update=update, note=note)
    finally:
        engine.close()
    typer.echo(shown(f"review {found.id}: {choice} by {who}; instance {rec.id} is {rec.status} "
                     f"in state {rec.state!r}"))
