"""Reading stored JSON text through a pydantic type (issue 37): one place that tells text
that is not JSON from JSON of the wrong shape, for the rows the store hands back as they
are (fleet limits, a schedule's input, a definition's export).

A stored value is hostile: another tool or a hand edit may have written it.  ``read``
turns what pydantic refuses into one ``StoreError`` line naming the row; the caller's
shape is its own (``OBJECT``: any JSON object, kept whole).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from ..errors import StoreError

T = TypeVar("T")

#: Any JSON object, its values as they are.
OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def read(adapter: TypeAdapter[T], text: Any, what: str, shape: str = "a JSON object") -> T:
    """``text`` (stored JSON: ``str`` or ``bytes``) read through ``adapter``.

    Raises:
        StoreError: ``"{what} not JSON: {why}"`` when ``text`` does not parse (``None``,
            empty, cut short), ``"{what} not {shape}"`` when it is not that shape
            (``what`` ends in its verb: ``"the stored input of schedule 'x' is"``).
    """
    if not isinstance(text, (str, bytes, bytearray)) or not text:
        raise StoreError(f"{what} not JSON: {type(text).__name__} {text!r:.20}")
    try:
        return adapter.validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise StoreError(f"{what} not JSON: {first['msg']}"[:300]) from None
        raise StoreError(f"{what} not {shape}") from None
