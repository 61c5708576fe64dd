"""The headers every viewer response carries: a strict CSP (no script, no framing),
no MIME sniffing, no referrer, no caching of pages that show stored data."""

from __future__ import annotations

__all__ = ["SECURITY_HEADERS", "LIVE_CSP"]

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; img-src 'self' data:; "
                                "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

#: The policy of a running instance's page: the same, plus the viewer's one same-origin
#: script (``static/stream.js``) and its ``EventSource`` to the page's own stream.
LIVE_CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; script-src 'self'; "
            "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
