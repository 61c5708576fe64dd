"""What an instance's context accepts: exactly the values that round-trip through JSON.

The context is stored as strict JSON (RFC 8259: no ``NaN``/``Infinity``
tokens, so SQLite's ``json_extract``/``json_valid`` and any JSON reader
accept every stored row).  Start input and every action's update pass the
same boundary, and a value that would come back different is refused with
``InvalidInput`` naming its field path (``meta.items[2]``), never silently
changed:

- ``bytes``/``bytearray``/``memoryview`` anywhere: refused (encode them
  yourself, e.g. base64 into a ``str`` field; pydantic would otherwise decode
  them as UTF-8, or fail on the first non-UTF-8 byte);
- ``float('nan')``, ``inf``, ``-inf``: refused;
- callables, open files and other I/O objects, generators and iterators,
  modules: refused (they have no JSON form; pydantic would drain a file as
  an iterator);
- in a field whose annotation admits anything (``Any``, ``object``,
  ``dict[str, Any]`` …) only plain JSON is accepted: ``dict`` with ``str``
  keys, ``list``, ``str``, ``int``, finite ``float``, ``bool``, ``None`` —
  a tuple, set, datetime, non-string key or model object there would come
  back as another type.  Typed fields (``datetime``, ``set[str]``, a nested
  model …) keep pydantic's own, reversible JSON form;
- a value nested deeper than ``MAX_DEPTH`` containers: refused (a 10,000-deep
  input would otherwise end in a ``RecursionError`` somewhere below).

An action may also change its context in place (``ctx.steps["a"].status = "done"``):
``Watched`` gives it a context sharing no mutable object with the stored record, and
``Watched.changed`` names the fields it changed, which ``apply_in_place`` commits with
its update through the same boundary (a value that cannot be stored is refused there).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import functools
import io
import math
import types
import typing
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import typing_extensions
from pydantic import BaseModel, ValidationError

from ..errors import InvalidInput
from ..json_input import MAX_DEPTH  # most levels of containers (dicts, lists, models) in a value

_PLAIN_SCALARS = (str, int, bool, type(None))
_BYTES = (bytes, bytearray, memoryview)
_OPAQUE = (io.IOBase, types.ModuleType, types.GeneratorType, types.CoroutineType,
           types.AsyncGeneratorType, Iterator)


def _join(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def _what(value: Any) -> str:
    return type(value).__name__


def _refuse(path: str, why: str) -> InvalidInput:
    return InvalidInput(f"{path or '(root)'}: {why}")


def _deeper(path: str, depth: int) -> int:
    """``depth + 1``: the depth of the items of a container at ``depth`` under ``path``;
    ``InvalidInput`` when that is deeper than ``MAX_DEPTH``."""
    if depth > MAX_DEPTH:
        shown = path if len(path) <= 80 else path[:80] + "…"
        raise _refuse(shown, f"nests deeper than {MAX_DEPTH} levels of containers")
    return depth + 1


def _scan(value: Any, path: str, plain: bool, depth: int = 1) -> None:
    """Raise ``InvalidInput`` for the first value under ``value`` that JSON cannot hold
    exactly (``plain``: only plain JSON types are allowed, as in an ``Any`` field), or
    that nests deeper than ``MAX_DEPTH`` (``depth``: containers above ``value``)."""
    cls = type(value)
    if cls in _PLAIN_SCALARS:
        return
    if cls is float:
        if not math.isfinite(value):
            raise _refuse(path, f"{value!r} has no JSON form (NaN and ±Infinity are refused)")
        return
    if cls is dict or (isinstance(value, Mapping) and not plain):
        _scan_mapping(value, path, plain, depth)
    elif cls is list or (isinstance(value, (list, tuple, set, frozenset)) and not plain):
        for i, item in enumerate(value):
            _scan(item, _join(path, i), plain, _deeper(path, depth))
    else:
        _scan_object(value, path, plain, depth)


def _scan_mapping(value: Mapping[Any, Any], path: str, plain: bool, depth: int) -> None:
    """``_scan`` of a mapping's keys (``plain``: strings only) and values."""
    for key, item in value.items():
        if plain and type(key) is not str:
            raise _refuse(path, f"key {key!r} is a {_what(key)}: in an untyped field "
                          "only string keys come back as they went in")
        _scan(item, _join(path, key), plain, _deeper(path, depth))


def _scan_object(value: Any, path: str, plain: bool, depth: int) -> None:
    """``_scan`` of what is neither a JSON scalar nor a container: bytes, opaque objects
    and callables are refused, as is anything but a model in a ``plain`` field; a
    model's fields are scanned."""
    if isinstance(value, _BYTES):
        raise _refuse(path, f"{_what(value)} is not stored: encode it (e.g. base64) into a str")
    if isinstance(value, _OPAQUE) or callable(value) and not isinstance(value, (type, BaseModel)):
        raise _refuse(path, f"a {_what(value)} cannot be stored as JSON")
    if plain:
        raise _refuse(path, f"a {_what(value)} in an untyped field would come back as another "
                      "type: store plain JSON (dict, list, str, int, float, bool, None) "
                      "or declare the field's type")
    if isinstance(value, BaseModel):
        for name, item in value.__dict__.items():
            _scan(item, _join(path, name), _loose(type(value)).__contains__(name),
                  _deeper(path, depth))


def _admits_any(annotation: Any) -> bool:
    if annotation is Any or annotation is object:
        return True
    return any(_admits_any(arg) for arg in typing.get_args(annotation))


@functools.lru_cache(maxsize=512)
def _loose(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` whose annotation admits arbitrary values."""
    return frozenset(name for name, info in model.model_fields.items()
                     if _admits_any(info.annotation))


_NATIVE_SCALARS = frozenset({str, int, float, bool, type(None)})


def _native(annotation: Any) -> bool:
    """Whether a value of ``annotation`` is validated as its own JSON form (``str``, ``int``,
    ``float``, ``bool``, ``None``, and lists, ``str``-keyed dicts and unions of them): its
    Python value compares with the stored JSON as it is, as a dump of it would."""
    if annotation in _NATIVE_SCALARS:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return _native(args[0])
    if origin is dict and len(args) == 2:
        return args[0] is str and _native(args[1])
    if origin is typing.Union or origin is types.UnionType:
        return all(_native(arg) for arg in args)
    return False


@functools.lru_cache(maxsize=512)
def _as_is(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` whose value ``Watched.changed`` compares with the stored JSON
    as it is, without a dump: those admitting anything (plain JSON, ``_loose``) and those
    whose validated value is its own JSON form (``_native``: ``list[str]`` …)."""
    return _loose(model) | frozenset(name for name, info in model.model_fields.items()
                                     if _native(info.annotation))


def check_values(model: type[BaseModel], values: Mapping[str, Any], path: str = "") -> None:
    """Refuse (``InvalidInput`` naming the field path) any value in ``values`` (field name →
    raw value, before validation) that would not come back from JSON as it went in."""
    loose = _loose(model)
    for name, value in values.items():
        if type(value) not in _PLAIN_SCALARS:
            _scan(value, _join(path, name), name in loose)


def check_json(data: Mapping[str, Any], path: str = "") -> None:
    """Refuse non-finite floats in an already JSON-dumped mapping (pydantic keeps them)."""
    for name, value in data.items():
        if type(value) not in _PLAIN_SCALARS:
            _scan(value, _join(path, name), True)


def dump(obj: BaseModel, fields: Any = None, only: Any = None) -> dict[str, Any]:
    """``obj`` as its JSON dict (``only``: just these fields); ``InvalidInput`` naming the
    field when pydantic cannot serialise it (``fields``: the names to blame first, e.g.
    the update's keys)."""
    try:
        return obj.model_dump(mode="json", include=only)
    except (ValueError, TypeError, UnicodeError) as exc:  # PydanticSerializationError: ValueError
        for name in list(fields or ()) + list(type(obj).model_fields):
            try:
                obj.model_dump(mode="json", include={name})
            except (ValueError, TypeError, UnicodeError):
                raise _refuse(name, f"cannot be stored as JSON: {exc}") from None
        raise InvalidInput(f"context cannot be stored as JSON: {exc}") from None


def _takes_info(dec: Any) -> bool:
    """Whether a field validator may read other fields (``info.data``); True when unsure."""
    try:
        from pydantic._internal._decorators import inspect_validator
        return bool(inspect_validator(dec.func, mode=dec.info.mode, type="field"))
    except Exception:  # noqa: BLE001 - a private API that may move: assume the worst
        return True


def partial_dump(model: type[BaseModel]) -> bool:
    """True when a step may serialise only the fields it updated (``model`` checked once,
    when a machine is compiled).

    Every update is still validated against the whole model (so every validator
    runs and a cross-field refusal still refuses), but only the updated fields are
    dumped; an unchanged field keeps its stored JSON (and its object, so the store
    neither re-encodes nor rewrites it).  That is exact unless something can change a
    field the step did not update, so this is False, and steps dump the whole model,
    for a model with a ``model_validator`` (or v1 ``root_validator``), a
    ``computed_field``, a field or model serializer, or a ``field_validator`` that takes
    ``info`` (it may read ``info.data``, i.e. other fields).  A single-argument field
    validator of an unchanged field already ran when its value was stored, so it is
    assumed idempotent.
    """
    d = model.__pydantic_decorators__
    if (d.model_validators or d.root_validators or d.computed_fields or d.field_serializers
            or d.model_serializers):
        return False
    return not any(_takes_info(dec) for dec in (*d.field_validators.values(),
                                                *d.validators.values()))


def keep_unchanged(old: Mapping[str, Any], new: dict[str, Any]) -> None:
    """Put ``old``'s objects back into ``new`` (in place) where a scalar or string is
    equal and of the same type, so the store sees them unchanged (by identity)."""
    for key, value in new.items():
        prior = old.get(key, new)
        if prior is not value and type(prior) is type(value) and type(value) in _KEEP \
                and prior == value:
            new[key] = prior


_KEEP = (str, int, float, bool)


def _reaches_any(annotation: Any, seen: set[type]) -> bool:
    """Whether a value of ``annotation`` may hold objects validation passes through
    (``Any``/``object`` at any depth, nested models' fields included)."""
    if annotation is Any or annotation is object:
        return True
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel)
                                         or typing_extensions.is_typeddict(annotation)
                                         or dataclasses.is_dataclass(annotation)):
        if annotation in seen:
            return False
        seen.add(annotation)
        try:
            hints = typing.get_type_hints(annotation)
        except Exception:  # noqa: BLE001 - an unresolvable hint: assume it may share
            return True
        return any(_reaches_any(hint, seen) for hint in hints.values())
    return any(_reaches_any(arg, seen) for arg in typing.get_args(annotation))


@functools.lru_cache(maxsize=512)
def _shared(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` whose validated value may share objects with its input."""
    return frozenset(name for name, info in model.model_fields.items()
                     if _reaches_any(info.annotation, set()))


def _copy(value: Any) -> Any:
    """A copy of plain JSON ``value`` (containers new, scalars shared)."""
    cls = type(value)
    if cls is dict:
        return {k: _copy(v) for k, v in value.items()}
    if cls is list:
        return [_copy(v) for v in value]
    return value


#: Types whose value can change only by assignment (seen by identity, no comparison).
_IMMUTABLE = frozenset({str, int, float, bool, type(None), decimal.Decimal, uuid.UUID,
                        datetime.datetime, datetime.date, datetime.time, datetime.timedelta})


class Watched:
    """The context an action runs on, and what is needed to see what it changed in place.

    ``Watched(model, data)``: ``ctx`` is ``model`` validated from stored JSON ``data``
    (the record before the step), sharing no mutable object with it: fields that reach
    ``Any`` (where pydantic passes objects through) are copied first; typed fields are
    built anew by pydantic.  ``before`` holds its fields' objects as validated (None
    when every field holds plain JSON: ``changed`` then compares each with ``stored``
    alone), ``stored`` is ``data``; ``changed`` then names what the action changed in
    place.  Raises what ``model_validate`` raises."""

    __slots__ = ("ctx", "before", "stored", "plain")

    def __init__(self, model: type[BaseModel], data: Mapping[str, Any]) -> None:
        shared, as_is, whole = _watching(model)
        source = {k: _copy(v) if k in shared else v for k, v in data.items()} if shared else data
        self.ctx: BaseModel = model.model_validate(source)
        self.before: dict[str, Any] | None = None if whole else dict(self.ctx.__dict__)
        self.stored = data
        #: Fields holding plain JSON as validated (``Any``, ``list[str]`` …: ``_as_is``):
        #: compared as they are, no dump.
        self.plain: frozenset[str] = as_is

    def changed(self, updated: Mapping[str, Any]) -> list[str]:
        """The fields outside ``updated`` the action changed in place: reassigned (another
        object), or a container or model whose JSON now differs from the stored one
        (``ctx.steps["a"].status = "done"``, ``ctx.tags.append(x)``).  A field holding plain
        JSON is compared with the stored JSON: reassigned to an equal value, it is unchanged."""
        if self.before is not None:
            return self._compared(updated, self.before)
        moved, stored = [], self.stored  # every field plain JSON (the usual context): one pass
        for k, v in self.ctx.__dict__.items():
            if k not in updated and v != stored.get(k):
                moved.append(k)
        return moved

    def _compared(self, updated: Mapping[str, Any], before: dict[str, Any]) -> list[str]:
        """``changed`` for a context with a field that is not plain JSON."""
        moved: list[str] = []
        maybe: list[str] = []
        stored = self.stored
        for k, v in self.ctx.__dict__.items():
            if k in updated:
                continue
            if v is not before.get(k):
                moved.append(k)
            elif k in self.plain:
                if v != stored.get(k):
                    moved.append(k)
            elif type(v) not in _IMMUTABLE and not isinstance(v, enum.Enum):
                maybe.append(k)
        if maybe:
            try:
                now = self.ctx.model_dump(mode="json", include=set(maybe), warnings=False)
            except (ValueError, TypeError):  # no JSON form: the update's check names it
                return moved + maybe
            moved += [k for k in maybe if now.get(k) != self.stored.get(k)]
        return moved


@functools.lru_cache(maxsize=512)
def _watching(model: type[BaseModel]) -> tuple[frozenset[str], frozenset[str], bool]:
    """``(_shared(model), _as_is(model), whether every field is as is)``: one cache
    look-up per step."""
    as_is = _as_is(model)
    return _shared(model), as_is, as_is >= model.model_fields.keys()


def apply_update(model: type[BaseModel], data: dict[str, Any], update: Mapping[str, Any],
                 fields: frozenset[str] | None = None, partial: bool = False
                 ) -> tuple[BaseModel, dict[str, Any], dict[str, Any]]:
    """Validate ``data`` + ``update``; return (model object, new JSON dict, JSON delta).

    ``fields`` is the model's field names (computed once per machine by the caller).
    The whole model is validated (every validator runs); with ``partial``
    (``values.partial_dump`` of the model) only the updated fields are serialised and
    the new dict holds ``data``'s very objects for the others, else the whole model is
    dumped and equal scalars and strings get ``data``'s objects back (so the store
    skips unchanged large values either way).
    Raises ``InvalidInput`` for unknown fields, values the model rejects or
    values that would not come back from JSON as they went in (``values``).
    """
    known = fields if fields is not None else frozenset(model.model_fields)
    unknown = [k for k in update if k not in known]
    if unknown:
        raise InvalidInput(f"update sets unknown context field(s): {', '.join(sorted(unknown))}")
    check_values(model, update)
    try:
        obj = model.model_validate({**data, **update})
    except ValidationError as exc:
        raise InvalidInput(f"context update rejected: {exc.errors()[0]['msg']} "
                           f"at {'.'.join(map(str, exc.errors()[0]['loc']))}") from None
    if partial:
        new = {**data, **dump(obj, update, only=set(update))}
    else:
        new = dump(obj, update)
        keep_unchanged(data, new)
    delta = {k: new[k] for k in update}
    check_json(delta)
    return obj, new, delta


def apply_in_place(model: type[BaseModel], data: dict[str, Any], update: Mapping[str, Any],
                   ran_on: Watched, moved: list[str], fields: frozenset[str] | None = None,
                   partial: bool = False) -> tuple[BaseModel, dict[str, Any], dict[str, Any]]:
    """``apply_update`` with the fields ``moved`` in place on ``ran_on.ctx`` added to
    ``update`` (``update`` wins); ``InvalidInput`` naming the field when such a change
    cannot be stored."""
    try:
        return apply_update(model, data, {**{k: getattr(ran_on.ctx, k) for k in moved},
                                          **update}, fields, partial)
    except InvalidInput as exc:
        raise InvalidInput(f"an in-place change to the context cannot be stored: {exc}"
                           ) from None


__all__ = ["check_values", "check_json", "dump", "partial_dump", "keep_unchanged",
           "Watched", "apply_update", "apply_in_place"]
