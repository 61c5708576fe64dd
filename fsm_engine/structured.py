"""Turn a model's text reply into a validated object.

:func:`parse_structured` runs one pipeline and either returns a :class:`Parsed`
or raises :class:`~fsm_engine.errors.StructuredOutputError`::

    text ─ strip whitespace and BOM
         ─ finish_reason == "length"?  → error, truncated=True (never repaired)
         ─ nests deeper than json_input.MAX_DEPTH levels?  → error (json would
           recurse as deep: a RecursionError)
         ─ find the JSON: first fenced block that holds a JSON object/array,
           else the first balanced {...} / [...] span in the prose
         ─ output ends inside that JSON?  → error, truncated=True
         ─ strict json.loads (NaN/Infinity rejected)
         ─ else json_repair (trailing commas, quotes, keys, comments, ...),
           refused when it changed a value (``repair_check``: a set read as a list,
           ``0x1F`` read as a string, a dropped duplicate key, ...)
         ─ NaN/Infinity anywhere → error
         ─ validate: pydantic model, JSON Schema (Draft 2020-12) or nothing

Every error carries ``raw`` (the original text), ``errors`` (one line per
problem, ``"path: message"`` for validation) and ``repairs`` (what had been
done before the failure).  :func:`reask_message` turns such an error into a
short message asking the model to try again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import json_repair
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ValidationError

from fsm_engine.errors import InvalidInput, StructuredOutputError
from fsm_engine.json_input import MAX_DEPTH, check_depth
from fsm_engine.repair_check import TOKEN as _TOKEN
from fsm_engine.repair_check import repair_changes

__all__ = ["Parsed", "parse_structured", "reask_message"]

FENCE = "removed markdown fence"
PROSE = "removed prose around JSON"
BOM = "stripped BOM"
NON_FINITE = "NaN/Infinity"

_MAX_REASK_ERRORS = 10
_MAX_MESSAGE_ERRORS = 3

_FENCE_OPEN = re.compile(r"```[\w+.-]*")
_BRACKET = re.compile(r"[{\[]")
_UNTERMINATED = {"dopen": "an unterminated string", "sopen": "an unterminated string",
                 "bopen": "an unterminated comment"}
_NON_FINITE_WORDS = {"nan", "inf", "infinity"}
_NOT_JSON = object()

Target = type[BaseModel] | dict[str, Any] | None
_Check = Callable[[Any], tuple[Any, list[str]]]   # data -> (value, problems)


@dataclass(frozen=True)
class Parsed:
    """A model reply turned into data.

    ``value`` is the validated object (a pydantic instance, or the plain JSON
    value for a JSON Schema or no target); ``data`` the plain JSON value
    before model validation; ``repairs`` what was fixed, in order (empty
    when the text was clean JSON).
    """

    value: Any
    data: Any
    repairs: tuple[str, ...]


@dataclass(frozen=True)
class _Span:
    """A JSON-looking span of text, from an opening bracket."""

    start: int
    end: int                  # exclusive; the scan limit when not closed
    truncated: str            # "" when balanced, else why the span never closes
    features: frozenset[str]  # defects json_repair would have to fix
    cut: bool = False         # truncated by the end of the text, not of a fence


@dataclass(frozen=True)
class _Candidate:
    """A span chosen as possibly *the* JSON, with the labels choosing it earns."""

    json: str
    span: _Span
    labels: tuple[str, ...]


def parse_structured(text: str, target: Target = None, *,
                     finish_reason: str | None = None) -> Parsed:
    """Parse, repair and validate a model reply.

    ``target`` is a pydantic model class (``value`` is an instance), a JSON
    Schema dict (``value`` is the plain JSON value) or None (no validation).

    Raises StructuredOutputError when the text is empty, is not JSON and holds
    no JSON object or array, was cut off (``finish_reason == "length"`` or the
    text ends inside the JSON: ``truncated`` is True), cannot be repaired,
    contains NaN/Infinity, or fails validation (``errors``: "path: message").
    Raises TypeError for a ``target`` of another kind and
    ``jsonschema.SchemaError`` for an invalid schema: those are caller bugs.
    """
    name, check = _checker(target)
    repairs: list[str] = []
    try:
        body = _clean(text, repairs, finish_reason)
        data = _extract(body, repairs)
        _reject_non_finite(data)
        value = _validate(data, name, check)
    except StructuredOutputError as err:
        err.raw, err.repairs = text, list(repairs)
        raise
    return Parsed(value=value, data=data, repairs=tuple(repairs))


def reask_message(err: StructuredOutputError, target: Target) -> str:
    """A short user message asking the model to answer again, correctly.

    It says what was wrong (at most ten problems from ``err.errors``) and
    shows the expected JSON Schema (none when ``target`` is None).
    """
    if err.truncated:
        lines = ["Your previous reply was cut off before the JSON was complete. "
                 "Answer again, more briefly."]
    else:
        lines = ["Your previous reply could not be used:"]
        lines += [f"- {problem}" for problem in err.errors[:_MAX_REASK_ERRORS] or [err.message]]
    ask = "Reply with only the JSON, no prose and no markdown fences"
    schema = target.model_json_schema() if isinstance(target, type) else target
    if schema is None:
        lines.append(ask + "; it must be a single valid JSON object or array.")
    else:
        lines.append(ask + ", matching this JSON Schema:")
        lines.append(json.dumps(schema, ensure_ascii=False))
    return "\n".join(lines)


# --- targets ----------------------------------------------------------------

def _checker(target: object) -> tuple[str, _Check]:
    """The target's name for messages (a schema's ``title``) and its check."""
    if target is None:
        return "", lambda data: (data, [])
    if isinstance(target, type) and issubclass(target, BaseModel):
        model = target
        return model.__name__, lambda data: _model_problems(data, model)
    if isinstance(target, dict):
        Draft202012Validator.check_schema(target)
        validator = Draft202012Validator(target)
        return (str(target.get("title", "the JSON Schema")),
                lambda data: (data, _schema_problems(data, validator)))
    raise TypeError(f"target must be a pydantic model class, a JSON Schema dict or None, "
                    f"not {target!r}")


def _validate(data: Any, name: str, check: _Check) -> Any:
    value, problems = check(data)
    if problems:
        shown, hidden = problems[:_MAX_MESSAGE_ERRORS], len(problems) - _MAX_MESSAGE_ERRORS
        more = f" (and {hidden} more)" if hidden > 0 else ""
        raise StructuredOutputError(f"model output does not match {name}: "
                                    f"{'; '.join(shown)}{more}", errors=problems)
    return value


def _schema_problems(data: Any, validator: Draft202012Validator) -> list[str]:
    found = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_path(e.absolute_path)}: {e.message}" for e in found]


def _model_problems(data: Any, model: type[BaseModel]) -> tuple[Any, list[str]]:
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, [f"{_path(e['loc'])}: {e['msg']}" for e in exc.errors()]


def _path(parts: Any) -> str:
    """``("categories", 0)`` → ``"$.categories[0]"``; the root is ``"$"``."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


# --- finding the JSON -------------------------------------------------------

def _clean(text: str, repairs: list[str], finish_reason: str | None) -> str:
    """``text`` without surrounding whitespace and BOM; refuses cut or empty text."""
    body = text.strip()
    if body.startswith("\ufeff"):
        body = body.lstrip("\ufeff").strip()
        repairs.append(BOM)
    if finish_reason == "length":
        raise StructuredOutputError("model output was cut off at max_tokens (finish_reason "
                                    "'length')", errors=["cut off at max_tokens"], truncated=True)
    if not body:
        raise StructuredOutputError("model output is empty", errors=["the reply was empty"])
    try:  # before json (and json_repair) would recurse as deep as the reply nests
        check_depth(body, "model output")
    except InvalidInput:
        deep = f"model output nests deeper than {MAX_DEPTH} levels of containers"
        raise StructuredOutputError(deep, errors=[deep]) from None
    return body


def _extract(body: str, repairs: list[str]) -> Any:
    """The JSON value in ``body``; appends the labels of what it took to get it."""
    whole, _ = _loads(body)
    if whole is not _NOT_JSON:
        return whole
    candidate, data = _choose(_fenced(body) or _in_prose(body))
    repairs.extend(candidate.labels)
    if candidate.span.cut:
        raise StructuredOutputError(
            f"model output looks truncated: it ends inside {candidate.span.truncated}",
            errors=[f"the JSON is incomplete: it ends inside {candidate.span.truncated}"],
            truncated=True)
    if NON_FINITE in candidate.span.features:
        raise StructuredOutputError("model output contains NaN or Infinity, which JSON "
                                    "does not allow", errors=["NaN/Infinity is not valid JSON"])
    return data if data is not _NOT_JSON else _repair(candidate, repairs)


def _choose(candidates: list[_Candidate]) -> tuple[_Candidate, Any]:
    """The candidate that is the reply's JSON, with its strict parse if it has one.

    Output ending inside JSON wins (it is truncated, whatever came before); then
    the first with NaN/Infinity or that parses strictly; else the first object
    (or failing that the first array), for repair.
    """
    if not candidates:
        raise StructuredOutputError("no JSON object or array found in model output",
                                    errors=["the reply contains no JSON object or array"])
    for cut in (c for c in candidates if c.span.cut):
        return cut, _NOT_JSON
    for candidate in candidates:
        if NON_FINITE in candidate.span.features:  # refused later, never repaired
            return candidate, _NOT_JSON
        data, _ = _loads(candidate.json)
        if data is not _NOT_JSON:
            return candidate, data
    return next((c for c in candidates if c.json.startswith("{")), candidates[0]), _NOT_JSON


def _fenced(body: str) -> list[_Candidate]:
    """Every markdown-fenced block whose whole content is one JSON object/array."""
    found: list[_Candidate] = []
    pos = 0
    while (opener := _FENCE_OPEN.search(body, pos)) is not None:
        candidate, pos = _fence_block(body, opener)
        if candidate is not None:
            found.append(candidate)
    return found


def _fence_block(body: str, opener: re.Match[str]) -> tuple[_Candidate | None, int]:
    """The JSON filling the fence that ``opener`` starts, and where to look next.

    A closing ``` inside a JSON string does not end the block: the bracket
    scan runs past it.  When that scan does not end right at a closing fence,
    the block is re-read up to the first ``` (its JSON is then incomplete).
    """
    naive = body.find("```", opener.end())
    limit, skip = (naive, naive + 3) if naive >= 0 else (len(body), len(body))
    start = limit - len(body[opener.end():limit].lstrip())
    if start >= limit or body[start] not in "{[":
        return None, skip
    span = _scan(body, start)
    close = -1 if span.truncated else body.find("```", span.end)
    if span.truncated or body[span.end:close if close >= 0 else len(body)].strip():
        span, close = _scan(body, start, limit), naive
        if not span.truncated and body[span.end:limit].strip():
            return None, skip
    end = close + 3 if close >= 0 else len(body)
    labels = (FENCE, PROSE) if body[:opener.start()].strip() or body[end:].strip() else (FENCE,)
    return _Candidate(body[span.start:span.end], span, labels), end


def _in_prose(body: str) -> list[_Candidate]:
    """Each balanced {...} / [...] span of ``body``, in order (the last may be open)."""
    found: list[_Candidate] = []
    pos = 0
    while (bracket := _BRACKET.search(body, pos)) is not None:
        span = _scan(body, bracket.start())
        labels = (PROSE,) if span.start > 0 or span.end < len(body) else ()
        found.append(_Candidate(body[span.start:span.end], span, labels))
        pos = span.end
    return found


def _scan(text: str, start: int, limit: int | None = None) -> _Span:
    """Match the bracket at ``text[start]``, skipping strings and comments.

    It also notes the defects json_repair would fix silently: that is how
    truncated output is told apart from merely sloppy output.
    """
    stack: list[str] = []
    features: set[str] = set()
    prev, word = "", ""
    end = len(text) if limit is None else limit
    for tok in _TOKEN.finditer(text, start, end):
        kind = tok.lastgroup or "other"
        if kind in _UNTERMINATED:
            return _Span(start, end, _UNTERMINATED[kind], frozenset(features), end == len(text))
        if kind in ("ws", "lcomment", "bcomment"):
            if kind != "ws":
                features.add("comments")
            continue
        if prev == "word":
            features.update(_word_defects(word, is_key=kind == "colon"))
        if _track(kind, tok.group(), stack, features, prev) and not stack:
            return _Span(start, tok.end(), "", frozenset(features))
        prev, word = kind, tok.group()
    if prev == "word":
        features.update(_word_defects(word, is_key=False))
    left = f"{len(stack)} unclosed bracket" + ("s" if len(stack) > 1 else "")
    return _Span(start, end, left, frozenset(features), end == len(text))


def _track(kind: str, text: str, stack: list[str], features: set[str], prev: str) -> bool:
    """One bracket or string token of ``_scan``: ``stack`` and ``features`` updated; True
    when it was a closing bracket."""
    if kind == "open":
        stack.append(text)
        return False
    if kind == "close":
        features.update(_close(stack, text, after_comma=prev == "comma"))
        return True
    if kind == "sstr":
        features.add("single quotes")
    return False


def _close(stack: list[str], closer: str, *, after_comma: bool) -> set[str]:
    """Pop ``stack`` down to the bracket ``closer`` closes; the defects seen."""
    defects = {"trailing commas"} if after_comma else set()
    opener = "{" if closer == "}" else "["
    if opener not in stack:
        return defects | {"mismatched brackets"}
    while stack.pop() != opener:
        defects.add("mismatched brackets")
    return defects


def _word_defects(word: str, *, is_key: bool) -> set[str]:
    bare = word.lstrip("-")
    if is_key:
        return {"unquoted keys"}
    if bare.lower() in _NON_FINITE_WORDS:
        return {NON_FINITE}
    if bare in ("True", "False", "None"):
        return {"Python literals"}
    return set() if bare in ("true", "false", "null") else {"unquoted values"}


# --- parsing and repairing --------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _loads(text: str) -> tuple[Any, str]:
    """Strict ``json.loads`` (no NaN/Infinity): ``(value, "")`` or ``(_NOT_JSON, why)``."""
    try:
        return json.loads(text, parse_constant=_reject_constant), ""
    except json.JSONDecodeError as exc:
        return _NOT_JSON, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
    except (ValueError, RecursionError) as exc:
        return _NOT_JSON, f"invalid JSON: {exc}"


def _repair(candidate: _Candidate, repairs: list[str]) -> Any:
    """Let json_repair fix a balanced span that strict parsing refused."""
    _, problem = _loads(candidate.json)
    if candidate.span.truncated:
        raise StructuredOutputError(f"the JSON in the reply is incomplete: it has "
                                    f"{candidate.span.truncated}", errors=[problem])
    failed = "model output is not valid JSON and could not be repaired"
    try:
        data = json_repair.repair_json(candidate.json, return_objects=True)
    except Exception as exc:  # a bug in the repair library must not crash the workflow
        raise StructuredOutputError(failed, errors=[problem, f"json_repair: {exc!r}"]) from exc
    if not isinstance(data, (dict, list)):
        raise StructuredOutputError(failed, errors=[problem])
    changed = repair_changes(candidate.json, data)
    if changed is not None:  # a repair may fix syntax, never a value: ask again instead
        raise StructuredOutputError(
            "model output is not valid JSON, and repairing it would change a value",
            errors=[problem, f"repair refused: {changed}"])
    fixed = sorted(candidate.span.features) or ["malformed JSON"]
    repairs.append("json_repair: " + ", ".join(fixed))
    return data


def _reject_non_finite(data: Any) -> None:
    """Refuse NaN/±Infinity anywhere in ``data`` (e.g. from ``1e999``)."""
    todo = [data]
    while todo:
        item = todo.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise StructuredOutputError("model output contains a number that is NaN or "
                                        "infinite", errors=[f"non-finite number: {item}"])
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
