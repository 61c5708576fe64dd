"""Signed review links: deciding one review item from a URL, no other credential.

A link names an item, a reviewer and an expiry (epoch seconds) and carries
``sig`` = HMAC-SHA256 over the three with a key kept in the store (``fsm_meta`` key
``review_link_key``: 32 random bytes, hex; made on first use, replaced by
``rotate_key``, which voids every link signed before).  A link is valid until its
expiry, once: the console marks it used (``review_link_used:SIG``, ``Store.add_meta``:
one of concurrent uses wins) in the request that decides, and it allows nothing but
deciding its item as its reviewer; the decision's history row names the link
(``Link.record``: its id, reviewer and expiry, not its signature).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidInput
from ...store.facets import MetaStore

KEY = "review_link_key"
USED = "review_link_used:"
#: Longest reviewer name in a link (characters), longest validity (seconds: 30 days).
MAX_NAME, MAX_TTL_S = 100, 30 * 86400


def link_id(sig: str) -> str:
    """A link's id: the first 16 hex digits of SHA-256 of its signature — names the link
    in the history without being its secret (the signature cannot be had from it)."""
    return hashlib.sha256(str(sig).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Link:
    """What a signed link claims: ``item`` decided ``by`` until ``expires`` (epoch s)."""

    item: str
    by: str
    expires: int
    sig: str

    def record(self) -> dict[str, Any]:
        """What the decision's history row keeps of the link (``detail.review.link``):
        ``id`` (``link_id``), ``by``, ``expires`` — never the signature."""
        return {"id": link_id(self.sig), "by": self.by, "expires": self.expires}


def _key(store: MetaStore, *, create: bool) -> bytes | None:
    raw = store.get_meta(KEY)
    if raw is None and create:
        store.add_meta(KEY, os.urandom(32).hex())  # one of concurrent creators wins
        raw = store.get_meta(KEY)
    try:
        return bytes.fromhex(raw) if raw else None
    except ValueError:
        return None


def rotate_key(store: MetaStore) -> None:
    """Replace the signing key: every link signed before stops working."""
    store.put_meta(KEY, os.urandom(32).hex())


def _mac(key: bytes, item: str, by: str, expires: int) -> str:
    msg = json.dumps([item, by, expires], separators=(",", ":")).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def check_name(by: str) -> str:
    """``by`` when it is a usable reviewer name; ``InvalidInput`` else."""
    if not (isinstance(by, str) and 0 < len(by) <= MAX_NAME and by.isprintable()):
        raise InvalidInput(f"a reviewer name is 1 to {MAX_NAME} printable characters")
    return by


def sign(store: MetaStore, item: str, by: str, ttl_s: float, now: float) -> Link:
    """A link letting ``by`` decide ``item`` for ``ttl_s`` seconds from ``now``."""
    if not 0 < ttl_s <= MAX_TTL_S:
        raise InvalidInput(f"a link's ttl is more than 0 and at most {MAX_TTL_S // 86400} days")
    key = _key(store, create=True)
    assert key is not None
    expires = int(now + ttl_s)
    return Link(item, check_name(by), expires, _mac(key, item, by, expires))


def url(base: str, link: Link) -> str:
    """The console URL of ``link`` under ``base`` (``http://host:port``)."""
    query = urllib.parse.urlencode({"by": link.by, "exp": link.expires, "sig": link.sig})
    return f"{base.rstrip('/')}/review/{urllib.parse.quote(link.item, safe='')}?{query}"


def verify(store: MetaStore, item: str, by: str, expires: str, sig: str, now: float) -> Link:
    """The link these request values make, when its signature holds, it has not expired
    and it was not used; ``InvalidInput`` (one line, saying which) else."""
    try:
        exp = int(expires)
    except (TypeError, ValueError):
        raise InvalidInput("this review link is malformed") from None
    key = _key(store, create=False)
    if key is None or not hmac.compare_digest(_mac(key, item, by, exp), str(sig)):
        raise InvalidInput("this review link is not valid (forged, altered or its key rotated)")
    if exp <= now:
        raise InvalidInput("this review link has expired")
    if store.get_meta(USED + sig) is not None:
        raise InvalidInput("this review link was already used")
    return Link(item, by, exp, sig)


def use(store: MetaStore, link: Link, now: float) -> None:
    """Mark ``link`` used (``InvalidInput`` when another request used it first)."""
    if not store.add_meta(USED + link.sig, json.dumps({"at": now, "item": link.item})):
        raise InvalidInput("this review link was already used")


def unuse(store: MetaStore, link: Link) -> None:
    """Give ``link`` back (its decision was refused for a fault the reviewer can fix)."""
    store.put_meta(USED + link.sig, None)
