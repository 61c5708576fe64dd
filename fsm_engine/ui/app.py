"""The viewer's ASGI app: Starlette routes rendering Jinja2 templates (autoescaped).

Pages: ``/`` (instances: filters, sort, pages), ``/instances/{id}``,
``/machines/{name}``; ``/static/…`` serves the stylesheet shipped in the
package (no CDN); ``/instances/{id}/stream`` is that instance's stream as Server-Sent
Events (``ui.stream``).  Every response carries a Content Security Policy without
scripts, so even a value that slipped through escaping could not run — except a
running instance's page, whose policy allows the one same-origin script of the package
(``static/stream.js``, the live text; ``headers.LIVE_CSP``).
With a token, every request needs ``Authorization: Bearer TOKEN``,
``?token=TOKEN`` (which also sets an HttpOnly, SameSite=Strict cookie so the
page's links work) or that cookie; anything else gets 401.  The cookie holds a session
value derived from the token (``session_value``), never the token: a browser sends
cookies of 127.0.0.1 to every port, so every other local service sees it.  With a ``HostRule``
(``fsm ui`` always gives one) a request whose ``Host`` it does not serve gets 421
first (``ui.hosts``: DNS rebinding).

Every value a page renders is capped at ``VALUE_CAP`` characters, with its full size
shown; ``/instances/{id}/json`` gives the whole instance (record, history, attempts,
outbox) as JSON.  Error pages show messages with credentials redacted; every response,
errors included, carries the security headers (``headers.Secured``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import InstanceNotFound, InvalidInput, StoreError
from ..redaction import redact
from ..store.base import Store
from .data import ListQuery, Viewer
from .headers import LIVE_CSP, SECURITY_HEADERS, Secured, authenticated
from .hosts import HostGate, HostRule
from .stream import stream_endpoint

HERE = Path(__file__).resolve().parent
COOKIE = "fsm_ui_token"


#: Most characters of one rendered value (a context value, a delta, a model reply …).
VALUE_CAP = 20_000


class Whole(Markup):
    """Markup the page shows whole (the diagram's SVG, drawn from escaped labels)."""


def capped(value: Any) -> Any:
    """Jinja's ``finalize``: every ``{{ value }}`` longer than ``VALUE_CAP`` characters is
    cut there, followed by a note of its full size (escaped text stays escaped)."""
    if isinstance(value, Whole) or not isinstance(value, str) or len(value) <= VALUE_CAP:
        return value
    note = (f" … [cut: {len(value):,} characters in all; the whole value is in this "
            "instance's JSON]")
    if isinstance(value, Markup):  # tojson output: JSON-escaped, so any cut is safe
        return Markup(str(value)[:VALUE_CAP]) + note
    return value[:VALUE_CAP] + note


def _templates() -> Jinja2Templates:
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True, finalize=capped)
    return Jinja2Templates(env=env)


#: The purpose label of the session value (``session_value``).
SESSION_LABEL = b"fsm ui session cookie v1"


def session_value(token: str) -> str:
    """The cookie's value for ``token``: HMAC-SHA256 of ``SESSION_LABEL`` under the token
    (hex).  It lets a browser in, but is not the token: a service that receives the
    cookie cannot use it as a bearer token or in ``?token=``."""
    return hmac.new(token.encode(), SESSION_LABEL, hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def _refused() -> Response:
    return PlainTextResponse("401: this viewer needs its token "
                             "(Authorization: Bearer …, or ?token=…)\n",
                             status_code=401, headers=SECURITY_HEADERS
                             | {"WWW-Authenticate": 'Bearer realm="fsm"'})


class TokenGate:
    """ASGI middleware: 401 unless the request carries the token (see the module doc).

    ``browser`` False: only ``Authorization: Bearer`` counts (no ``?token=``, no cookie:
    ``fsm serve``); ``denied``: the 401 response (default: the viewer's one line)."""

    def __init__(self, app: Any, token: str | None, open_prefix: str | None = None, *,
                 browser: bool = True, denied: Callable[[], Response] = _refused) -> None:
        if token is not None and (not token or any(c.isspace() for c in token)):
            raise InvalidInput("a viewer token is one word: no spaces, not blank")
        self.app = app
        self.token = token
        self.session = session_value(token) if token is not None else None
        #: Paths under it need no token: the console's signed review links, which the
        #: route itself verifies (``ui.actions``); ``None``: every path needs it.
        self.open_prefix = open_prefix
        self.browser, self.denied = browser, denied

    def _ok(self, request: Request) -> tuple[bool, bool]:
        """(allowed, came in the query string)."""
        token, given = str(self.token), request.headers.get("authorization", "")
        if given.lower().startswith("bearer ") and _same(given[7:].strip(), token):
            return True, False
        if not self.browser:
            return False, False
        if _same(request.query_params.get("token", ""), token):
            return True, True
        return _same(request.cookies.get(COOKIE, ""), str(self.session)), False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.token is None or (
                self.open_prefix and scope.get("path", "").startswith(self.open_prefix)):
            if self.token is None:
                authenticated(scope)  # no token to wait for (loopback only)
            await self.app(scope, receive, send)
            return
        allowed, from_query = self._ok(Request(scope))
        if allowed:
            authenticated(scope)
        if not allowed:
            await self.denied()(scope, receive, send)
            return
        if not from_query:
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: Any) -> None:
            if message["type"] == "http.response.start":
                cookie = f"{COOKIE}={self.session}; HttpOnly; SameSite=Strict; Path=/"
                message.setdefault("headers", []).append((b"set-cookie", cookie.encode()))
            await send(message)
        await self.app(scope, receive, send_with_cookie)


def _status(exc: Exception) -> int:
    """The HTTP status of an error a page's data raised."""
    if isinstance(exc, InstanceNotFound):
        return 404
    return 400 if isinstance(exc, InvalidInput) else 503


def _headers(data: dict[str, Any]) -> dict[str, str]:
    """A page's headers: ``SECURITY_HEADERS``, with ``LIVE_CSP`` on a running instance's
    page (it runs the live-text script)."""
    if data.get("live"):
        return SECURITY_HEADERS | {"Content-Security-Policy": LIVE_CSP}
    return SECURITY_HEADERS


def _whole(viewer: Viewer) -> Callable[[Request], Awaitable[Response]]:
    """``/instances/{id}/json``: ``Viewer.whole`` as JSON (nothing cut)."""
    async def endpoint(request: Request) -> Response:
        try:
            data = await run_in_threadpool(viewer.whole, request.path_params["instance_id"])
        except (InstanceNotFound, StoreError) as exc:
            return JSONResponse({"error": redact(exc)}, _status(exc), headers=SECURITY_HEADERS)
        return JSONResponse(data, headers=SECURITY_HEADERS)
    return endpoint


def _gate(app: Any, token: str | None, write: bool) -> TokenGate:
    """The token gate; with the console, its signed review links pass to their route."""
    return TokenGate(app, token, "/review/" if write else None)


def create_app(store: Store, *, token: str | None = None, refresh_s: int = 3,
               hosts: HostRule | None = None, console: Any = None) -> Any:
    """The viewer over ``store`` (open it read-only); ``token`` None: no token needed
    (for loopback only — ``fsm ui`` enforces that); running pages reload every
    ``refresh_s`` seconds; ``hosts`` None: any ``Host`` (``fsm ui`` gives a rule).
    ``console``: a ``ui.actions.Console`` adding the write routes (``fsm ui --write``,
    which requires ``token``); None: no route accepts a POST."""
    viewer = Viewer(store)
    templates = _templates()
    write = console is not None

    def page(name: str, request: Request, data: dict[str, Any], status: int = 200) -> Response:
        if isinstance(data.get("svg"), str):
            data = data | {"svg": Whole(data["svg"])}
        data = data | {"refresh_s": refresh_s, "machines_nav": viewer.machines(),
                       "write": write}
        response = templates.TemplateResponse(request, name, data, status_code=status)
        response.headers.update(_headers(data))
        return response

    def guarded(fn: Callable[[Request], dict[str, Any]], name: str
                ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:  # store reads block: run them off the event loop
                data = await run_in_threadpool(fn, request)
            except (InstanceNotFound, InvalidInput, StoreError) as exc:
                return page("error.html", request, {"message": redact(exc)}, _status(exc))
            return page(name, request, data)
        return endpoint

    def instances(request: Request) -> dict[str, Any]:
        return viewer.instances(ListQuery.parse(request.query_params))

    def instance(request: Request) -> dict[str, Any]:
        data = viewer.instance(request.path_params["instance_id"])
        return data | {"live": data.get("refresh", False)}

    def machine(request: Request) -> dict[str, Any]:
        return viewer.machine(request.path_params["name"],
                              request.query_params.get("status", ""))

    async def not_found(request: Request, exc: Exception) -> Response:
        return page("error.html", request, {"message": "no such page"}, 404)

    routes = [Route("/", guarded(instances, "instances.html")),
              Route("/instances/{instance_id}/json", _whole(viewer)),
              Route("/instances/{instance_id}/stream", stream_endpoint(store)),
              Route("/instances/{instance_id}", guarded(instance, "instance.html")),
              Route("/machines/{name:path}", guarded(machine, "machine.html")),
              Route("/schedules", guarded(lambda request: viewer.schedules(), "schedules.html")),
              Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")]
    routes[-1:-1] = console.routes(page) if write else []
    app = Starlette(routes=routes, exception_handlers={404: not_found})
    gated = _gate(app, token, write)
    return Secured(gated if hosts is None else HostGate(gated, hosts))


__all__ = ["create_app", "TokenGate", "session_value", "HTMLResponse"]
