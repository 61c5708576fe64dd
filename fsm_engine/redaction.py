"""Credentials out of URLs, DSNs and error texts, before any is printed, stored or served.

One function, :func:`redact`, takes any text — a bare URL, a libpq keyword DSN or an
error message quoting either — and returns it without the secrets it holds:

- a URL's ``user:password@`` keeps the user (``user@host``);
- a URL's query or fragment parameter whose name says it is a secret
  (:func:`secret_name`: password, passwd, pass, pwd, sslpassword, secret, token,
  access_token, key, api_key, apikey, auth, authorization, sig, … also percent-encoded,
  any case, with ``-``/``_``; not ``tokens_used``, ``token_budget``, ``max_tokens``) is left
  out, so what remains still connects (libpq then takes the password from
  ``PGPASSWORD`` or ``~/.pgpass``);
- anywhere else, ``NAME=VALUE`` / ``NAME = 'quoted value'`` with such a name (a
  keyword DSN such as ``host=db password=s3cret``) becomes ``NAME=***``;
- ``Authorization: …`` header values and ``Bearer …`` tokens become ``***``.

Text without any of these comes back unchanged.  :func:`redact` never raises.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["redact", "secret_name", "MASK"]

#: What a secret value is replaced with where it cannot simply be left out.
MASK = "***"
#: Parameter names (lower-case, without ``-_.``) holding a secret: any name containing
#: one of ``_SECRET_PARTS``, or ending in one of ``_SECRET_ENDS`` (``api_key``,
#: ``access_token``; not ``tokens_used`` or ``token_budget``), or starting with ``auth``.
_SECRET_PARTS = ("pass", "pwd", "secret", "credential", "signature", "privatekey")
_SECRET_ENDS = ("key", "token", "auth", "sig")
#: Names that end like a secret but are not one.
_NOT_SECRET = frozenset({"idempotencykey", "partitionkey", "primarykey", "foreignkey",
                         "maxtoken"})
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
_USERINFO = re.compile(r"^(?P<user>[^:@]*):(?P<pw>.*)@(?=[^@]*$)", re.S)
_KEYWORD = re.compile(
    r"(?P<name>[A-Za-z_%][\w%.\-]*)(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&;,'\"<>)\]}]+)")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=\-]{6,}")
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization\s*:\s*)(?:(?:basic|bearer|digest|token)\s+)?[^\s,;]+")


def secret_name(name: str) -> bool:
    """True when a parameter named ``name`` (percent-encoded or not) holds a secret."""
    plain = urllib.parse.unquote(urllib.parse.unquote(name)).lower()
    plain = re.sub(r"[\s_.\-]", "", plain)
    if plain in _NOT_SECRET:
        return False
    return (any(part in plain for part in _SECRET_PARTS) or plain.endswith(_SECRET_ENDS)
            or plain.startswith("auth"))


def _params(text: str) -> str:
    """A query string (or fragment) without its secret parameters."""
    kept = [p for p in re.split(r"[&;]", text) if p and not secret_name(p.split("=", 1)[0])]
    return "&".join(kept)


def _netloc(netloc: str) -> str:
    """``user:password@host`` -> ``user@host`` (a raw ``@`` in the password included)."""
    match = _USERINFO.match(netloc)
    if match is None:
        return netloc
    user = match.group("user")
    rest = netloc[match.end():]
    return f"{user}@{rest}" if user else rest


def _url(match: re.Match[str]) -> str:
    url = match.group(0)
    scheme, sep, rest = url.partition("://")
    end = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at != -1:
            end = min(end, at)
    netloc, tail = rest[:end], rest[end:]
    path, qmark, query = tail.partition("?")
    if not qmark:
        path, hmark, fragment = tail.partition("#")
        query = ""
    else:
        query, hmark, fragment = query.partition("#")
    query, fragment = _params(query), _params(fragment)
    out = scheme + sep + _netloc(netloc) + path
    return out + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")


def _keyword(match: re.Match[str]) -> str:
    if not secret_name(match.group("name")):
        return match.group(0)
    return f"{match.group('name')}{match.group('eq')}{MASK}"


def redact(text: object) -> str:
    """``str(text)`` with every credential removed or masked (see the module doc)."""
    try:
        out = str(text)
    except Exception:  # noqa: BLE001 - a hostile __str__: show nothing of it
        return "(unprintable)"
    out = _URL.sub(_url, out)
    out = _KEYWORD.sub(_keyword, out)
    out = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{MASK}", out)
    return _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", out)
