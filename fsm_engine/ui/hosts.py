"""The viewer's ``Host`` check: a defence against DNS rebinding.

A web page on ``evil.example`` can rebind its own name to 127.0.0.1 and then read the
viewer through the user's browser: the request reaches the loopback socket with
``Host: evil.example``.  :class:`HostGate` serves only requests whose ``Host`` names

- the viewer's own port on a loopback name (``localhost``, ``127.0.0.1``, any
  127.0.0.0/8 address, ``[::1]``) or on the address it is bound to (any IP literal
  when bound to every address: an IP literal is never a rebound name), or
- a name given explicitly (``fsm ui --allowed-host NAME``; with ``NAME:PORT`` only
  on that port, else on any: a reverse proxy may serve it on 443).

Anything else (no ``Host``, another name, another port) gets ``421 Misdirected
Request`` with a one-line body and none of the database's data.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .headers import SECURITY_HEADERS

__all__ = ["HostRule", "HostGate"]

LOOPBACK_NAMES = ("localhost",)
WILDCARDS = ("0.0.0.0", "::", "")


def _split(host: str) -> tuple[str, int | None]:
    """``name[:port]`` / ``[v6][:port]`` -> (lower-case name without brackets, port)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
    else:
        name, port = host, ""
    if port and not port.isdigit():
        return name, -1
    return name.rstrip("."), int(port) if port else None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class HostRule:
    """Which ``Host`` headers the viewer bound to ``bind``:``port`` serves (module doc).

    ``allowed``: extra names (``NAME`` any port, ``NAME:PORT`` that port only).
    """

    bind: str
    port: int
    allowed: Sequence[str] = field(default_factory=tuple)

    def _own(self, name: str) -> bool:
        ip = _ip(name)
        if name in LOOPBACK_NAMES or (ip is not None and ip.is_loopback):
            return True
        bound = self.bind.strip("[]").lower()
        if ip is not None and bound in WILDCARDS:
            return True
        return ip is not None and _ip(bound) == ip

    def serves(self, host: str | None) -> bool:
        """True when a request with this ``Host`` header may be answered."""
        if not host:
            return False
        name, port = _split(host)
        for extra in self.allowed:
            want, want_port = _split(extra)
            if name == want and (want_port is None or want_port == (port or 80)):
                return True
        return (port if port is not None else 80) == self.port and self._own(name)


def _misdirected() -> Any:
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(
        "421: this viewer does not serve that Host (start fsm ui with "
        "--allowed-host NAME to serve a name)\n", status_code=421,
        headers=SECURITY_HEADERS)


class HostGate:
    """ASGI middleware: 421 for a request whose ``Host`` the ``rule`` does not serve
    (``misdirected()``: that response, default the viewer's one line)."""

    def __init__(self, app: Any, rule: HostRule, misdirected: Callable[[], Any] = _misdirected
                 ) -> None:
        self.app, self.rule, self.misdirected = app, rule, misdirected

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = {v.decode("latin-1") for k, v in scope.get("headers") or () if k == b"host"}
        if len(hosts) == 1 and self.rule.serves(next(iter(hosts))):
            await self.app(scope, receive, send)
            return
        await self.misdirected()(scope, receive, send)
