"""Credentials out of URLs, DSNs and error texts, before any is printed, stored or served.

One function, :func:`redact`, takes any text — a bare URL, a libpq keyword DSN or an
error message quoting either — and returns it without the secrets it holds:

- a URL's ``user:password@`` keeps the user (``user@host``);
- a URL's query or fragment parameter whose name says it is a secret
  (:func:`secret_name`: password, passwd, pass, pwd, sslpassword, secret, token,
  access_token, key, api_key, apikey, auth, authorization, sig, … also percent-encoded,
  any case, with ``-``/``_``/``.`` or camelCase between words; the name's words are read,
  not its letters: not ``tokens_used``, ``token_budget``, ``max_tokens``, ``author``,
  ``passage``, ``monkey``) is left out, so what remains still connects (libpq then takes
  the password from ``PGPASSWORD`` or ``~/.pgpass``);
- anywhere else, ``NAME=VALUE`` / ``NAME = 'quoted value'`` with such a name (a
  keyword DSN such as ``host=db password=s3cret``) becomes ``NAME=***``;
- ``Authorization: …`` header values and ``Bearer …`` tokens become ``***``;
- a value shaped like a well-known credential (:func:`credential_like`: an OpenAI
  ``sk-…`` key, a GitHub ``ghp_…`` / ``github_pat_…`` token, a Slack ``xox…-`` token, an
  AWS ``AKIA…`` key id, a Google ``AIza…`` key, a GitLab ``glpat-…`` token, a JWT)
  becomes ``***`` wherever it stands.

Text without any of these comes back unchanged.  :func:`redact` never raises.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["redact", "secret_name", "credential_like", "MASK"]

#: What a secret value is replaced with where it cannot simply be left out.
MASK = "***"
#: A name's words (lower-case, split at ``-_.``, spaces and camelCase) say it holds a
#: secret when one of them ends in a word of ``_SECRET_WORDS`` (``sslpassword``,
#: ``client_secret``, ``password_hash``), or its last word (the compound's head:
#: ``api_key``, ``access_token``; not ``token_budget``) is one of ``_SECRET_HEADS``, ends in
#: one of ``_SECRET_HEAD_ENDS`` or is a ``_KEY_KINDS`` key (``sessionkey``), or its first
#: word is ``auth``/``authorization``.
_SECRET_WORDS = ("password", "passwd", "passphrase", "pwd", "secret", "secrets",
                 "credential", "credentials", "privatekey", "apikey")
_SECRET_HEADS = frozenset({"key", "token", "auth", "sig", "pass", "signature", "bearer",
                           "authorization"})
#: What a one-word ``…key`` head begins with to be a secret (``apikey``, ``sessionkey``;
#: not ``monkey``, ``hockey``).
_KEY_KINDS = frozenset({"api", "access", "secret", "signing", "session", "master", "private",
                        "encryption", "license", "client", "app", "auth", "ssh", "gpg"})
_SECRET_HEAD_ENDS = ("token", "auth", "signature")
_SECRET_FIRST = frozenset({"auth", "authorization"})
#: Names whose words read like a secret but are not one (words joined).
_NOT_SECRET = frozenset({"idempotencykey", "partitionkey", "primarykey", "foreignkey",
                         "maxtoken", "sortkey", "cachekey", "replykey", "outboxkey"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: Values shaped like well-known credentials, wherever they stand.
_CREDENTIAL = re.compile(
    r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_\-]{35}|glpat-[A-Za-z0-9_\-]{20,}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
_USERINFO = re.compile(r"^(?P<user>[^:@]*):(?P<pw>.*)@(?=[^@]*$)", re.S)
_KEYWORD = re.compile(
    r"(?P<name>[A-Za-z_%][\w%.\-]*)(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&;,'\"<>)\]}]+)")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=\-]{6,}")
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization\s*:\s*)(?:(?:basic|bearer|digest|token)\s+)?[^\s,;]+")


def secret_name(name: str) -> bool:
    """True when a parameter or field named ``name`` (percent-encoded or not) holds a
    secret: its words are read (see ``_SECRET_WORDS``), not the letters inside them, so
    ``author`` and ``passage`` are not secrets while ``Authorization`` and ``db_pass`` are."""
    plain = urllib.parse.unquote(urllib.parse.unquote(name))
    words = [w.lower() for w in _WORD.findall(plain)]
    if not words or "".join(words) in _NOT_SECRET:
        return False
    joined = "".join(words)
    if any(w.endswith(_SECRET_WORDS) for w in (*words, joined)):
        return True
    head = words[-1]
    return (head in _SECRET_HEADS or head.endswith(_SECRET_HEAD_ENDS)
            or (head.endswith("key") and head[:-3] in _KEY_KINDS) or words[0] in _SECRET_FIRST)


def credential_like(text: str) -> bool:
    """True when ``text`` holds a value shaped like a well-known credential (an ``sk-…``
    key, a ``ghp_…`` token, a JWT …; see the module doc)."""
    return _CREDENTIAL.search(text) is not None


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
    out = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", out)
    return _CREDENTIAL.sub(MASK, out)
