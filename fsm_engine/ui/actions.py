"""The console: the viewer's write routes, served only by ``fsm ui --write`` (issue 25).

Every action is two requests: ``GET`` shows a confirmation page saying what will
change (for a bulk action, how many instances and a sample) with a form; ``POST`` of
that form does it.  Routes:

- ``/console/instances/{id}/{action}``: pause, unpause, cancel, send, rerun, fork;
- ``/console/bulk/{action}?machine=&status=&state=&reason=&q=``: cancel, pause,
  unpause, fork, rerun over every instance matching the viewer's filters
  (``runtime.bulk``);
- ``/console/reviews/{item}``: decide a review item;
- ``/review/{item}?by=&exp=&sig=``: the same, from a signed link
  (``runtime.kinds.review_links``), the one path the token does not guard.

Defences on every ``POST``: the viewer's token (``app.TokenGate``; ``--write`` needs
one, also on loopback), or for ``/review/…`` the link's signature, checked before any
of the body is read; a CSRF token, HMAC of the whole action (``action_key``: the path,
the query in canonical order and, for a bulk action, the digest of the instances its
confirmation counted) under a key made when the server starts, that a forged
cross-site form cannot know (a form of one action, instance or filter is refused on
another); a bulk ``POST`` plans again and is refused (409, nothing done) unless it
finds exactly the instances its confirmation counted; a cross-site ``Origin`` or
``Sec-Fetch-Site`` is refused; the body is capped at ``MAX_FORM`` bytes and
``MAX_FIELDS`` fields, its JSON fields read by the bounded parser (``json_input``).  Each action's history row names
who did it (``detail.operator``: the name typed in the form, or the link's reviewer; a
link's decision also names the link, ``detail.review.link``: ``review_links.Link.record``); a
fork (or a rerun, made as a fork) writes no row of its own: its record names them
(``fork_options["by"]``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import json_input
from ..errors import FsmError, InstanceNotFound, InvalidInput, StaleWrite
from ..redaction import redact
from ..runtime.kinds import review_links
from ..store.records import InstanceFilter
from .headers import authenticated

#: Largest form body accepted (bytes), most fields in it.
MAX_FORM, MAX_FIELDS = 64 * 1024, 200
#: The per-instance actions.
INSTANCE_ACTIONS = ("pause", "unpause", "cancel", "resume", "send", "rerun", "fork")
#: What each action changes, for the confirmation page.
CHANGES = {
    "pause": "status → paused: no worker takes it and its timers stop (a running step "
             "finishes and commits first)",
    "unpause": "status paused → the status it had; its timers run on with the time left",
    "cancel": "status → cancelled (final); a running step is stopped",
    "resume": "a cancelled or failed instance runs again where it stopped (a failed one "
              "from just before its last failure)",
    "send": "fires the trigger on the waiting instance with the context update",
    "rerun": "a new instance (a fork) that runs the chosen state again",
    "fork": "a new instance from this one's history (just before its last failure, "
            "or before the chosen state)",
}

Page = Callable[[str, Request, dict[str, Any], int], Response]


def _status(exc: Exception) -> int:
    return 404 if isinstance(exc, InstanceNotFound) else 400 if isinstance(
        exc, InvalidInput) else 409


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded body, at most ``MAX_FORM`` bytes and ``MAX_FIELDS`` fields
    (``InvalidInput`` beyond, or when the client left before sending it)."""
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise InvalidInput(f"a form is at most {MAX_FORM} bytes")
    except ClientDisconnect:
        raise InvalidInput("the form's body did not arrive") from None
    try:
        pairs = urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True,
                                       max_num_fields=MAX_FIELDS)
    except ValueError:
        raise InvalidInput(f"a form has at most {MAX_FIELDS} fields") from None
    return dict(pairs)


def action_key(request: Request, plan: str = "") -> str:
    """The whole action a form confirms: its path, its query in canonical order (``token``
    left out: it is no part of the action) and ``plan`` (a bulk action's digest)."""
    pairs = sorted((k, v) for k, v in urllib.parse.parse_qsl(
        request.url.query, keep_blank_values=True) if k != "token")
    return "\n".join((request.url.path, urllib.parse.urlencode(pairs), plan))


def plan_digest(ids: list[str]) -> str:
    """The digest of a bulk plan's instances (in its order): what a confirmation counted."""
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def _same_site(request: Request) -> bool:
    """False for a request a browser marks cross-site: by ``Sec-Fetch-Site`` (which page
    content cannot set) when the browser sends it, else by an ``Origin`` naming another
    host than the one the request was sent to (the pages' ``no-referrer`` policy makes a
    browser send ``Origin: null`` even from the console's own form, so ``Sec-Fetch-Site``
    decides where it is present)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True  # not a browser's form: the token and the CSRF token still hold
    return urllib.parse.urlsplit(origin).netloc == request.headers.get("host", "")


def _json_object(text: str | None, what: str) -> dict[str, Any] | None:
    """``text`` as a JSON object (None when empty) by the bounded parser; ``InvalidInput``
    when it is not one or nests too deep."""
    if not text:
        return None
    return json_input.parse_object(text, f"the {what}")


def _name(form: dict[str, str]) -> str:
    name = form.get("as", "").strip()
    if not (0 < len(name) <= 100 and name.isprintable()):
        raise InvalidInput("say who you are (the 'as' field: 1 to 100 characters); it goes "
                           "into the history")
    return name


def _where(params: Any) -> InstanceFilter:
    def many(key: str) -> tuple[str, ...] | None:
        return tuple(v for v in params.getlist(key) if v) or None
    return InstanceFilter(machine=params.get("machine") or None, statuses=many("status"),
                          states=many("state"), reasons=many("reason"),
                          text=params.get("q") or params.get("text") or None, top_level=True)


class Console:
    """The write routes over ``engine`` (``fsm ui --write``); ``clock``: epoch seconds."""

    def __init__(self, engine: Any, clock: Callable[[], float] = time.time) -> None:
        self.engine, self.store, self.clock = engine, engine.store, clock
        self._csrf_key = os.urandom(32)

    def csrf(self, action: str) -> str:
        """The CSRF token of the form confirming ``action`` (``action_key``)."""
        return hmac.new(self._csrf_key, action.encode(), hashlib.sha256).hexdigest()

    def _checked(self, request: Request, form: dict[str, str]) -> None:
        if not _same_site(request):
            raise PermissionError("a cross-site request: refused")
        expected = self.csrf(action_key(request, form.get("plan", "")))
        if not hmac.compare_digest(form.get("csrf", ""), expected):
            raise PermissionError("this form's CSRF token is missing or wrong (or it was "
                                  "confirmed for another action): open the confirmation "
                                  "page again")

    def _confirm(self, request: Request, data: dict[str, Any]) -> dict[str, Any]:
        """A confirmation page's data: its form's CSRF token, bound to the whole action."""
        plan = data.get("plan", "")
        return data | {"csrf": self.csrf(action_key(request, plan)), "plan": plan,
                       "action_url": str(request.url.path)
                       + (f"?{request.url.query}" if request.url.query else "")}

    def routes(self, page: Page) -> list[Route]:
        """The console's routes, rendering with ``page(template, request, data, status)``."""
        def endpoint(show: Callable[[Request], Awaitable[dict[str, Any]]],
                     do: Callable[[Request, dict[str, str]], Awaitable[dict[str, Any]]],
                     gate: Callable[[Request], Awaitable[Any]] | None = None
                     ) -> Callable[[Request], Awaitable[Response]]:
            async def handle(request: Request) -> Response:
                try:
                    if request.method == "GET":
                        return page("confirm.html", request,
                                    self._confirm(request, await show(request)), 200)
                    if gate is not None:
                        await gate(request)  # before a byte of the body is read
                    form = await _form(request)
                    self._checked(request, form)
                    return page("done.html", request, await do(request, form), 200)
                except PermissionError as exc:
                    return page("error.html", request, {"message": str(exc)}, 403)
                except FsmError as exc:
                    return page("error.html", request, {"message": redact(exc)}, _status(exc))
            return handle
        both = ["GET", "POST"]
        return [Route("/console/instances/{iid}/{action}",
                      endpoint(self._show_instance, self._do_instance), methods=both),
                Route("/console/bulk/{action}", endpoint(self._show_bulk, self._do_bulk),
                      methods=both),
                Route("/console/reviews/{item}", endpoint(self._show_review, self._do_review),
                      methods=both),
                Route("/review/{item}", endpoint(self._show_link, self._do_link, self._gate),
                      methods=both)]

    # -- one instance ------------------------------------------------------------------
    async def _show_instance(self, request: Request) -> dict[str, Any]:
        iid, action = request.path_params["iid"], request.path_params["action"]
        if action not in INSTANCE_ACTIONS:
            raise InvalidInput(f"no console action {action!r}")
        rec = await run_in_threadpool(self.store.get, iid)
        states = [h.dest for h in await run_in_threadpool(self.store.history, rec.id)]
        return {"kind": "instance", "action": action, "rec": rec, "change": CHANGES[action],
                "states": list(dict.fromkeys([*states, rec.state]))}

    async def _do_instance(self, request: Request, form: dict[str, str]) -> dict[str, Any]:
        iid, action = request.path_params["iid"], request.path_params["action"]
        who = _name(form)
        eng = self.engine
        if action == "send":
            update = _json_object(form.get("update"), "update") or {}
            rec = await eng.signal(iid, form.get("trigger", ""), update, operator=who)
            return {"message": f"{rec.id}: {form.get('trigger')} sent; now {rec.status} in "
                               f"state {rec.state}", "iid": rec.id}
        return await run_in_threadpool(self._instance_action, action, iid, who, form)

    def _instance_action(self, action: str, iid: str, who: str, form: dict[str, str]
                         ) -> dict[str, Any]:
        eng = self.engine
        if action == "pause":
            rec = eng.pause(iid, by=who, reason=form.get("why") or "paused")
            how = "paused" if rec.status == "paused" else "pause requested (its step commits first)"
            return {"message": f"{rec.id}: {how}", "iid": rec.id}
        if action == "unpause":
            rec = eng.unpause(iid, by=who)
        elif action == "cancel":
            rec = eng.cancel(iid, operator=who)
        elif action == "resume":
            rec = eng.restart(iid, by=who)
        elif action in ("rerun", "fork"):
            state = form.get("state") or None
            if action == "rerun" and state is None:
                raise InvalidInput("choose the state to run again")
            new = (eng.rerun(iid, state, by=who) if action == "rerun" and state
                   else eng.fork(iid, from_state=state, from_failure=state is None, by=who))
            return {"message": f"{new}: forked from {iid} by {who}", "iid": new}
        else:
            raise InvalidInput(f"no console action {action!r}")
        return {"message": f"{rec.id}: {rec.status} in state {rec.state}", "iid": rec.id}

    # -- many --------------------------------------------------------------------------
    async def _show_bulk(self, request: Request) -> dict[str, Any]:
        action = request.path_params["action"]
        plan = await run_in_threadpool(self.engine.bulk_plan, action,
                                       _where(request.query_params))
        return {"kind": "bulk", "action": action, "count": plan.count, "sample": plan.sample,
                "change": CHANGES.get(action, ""), "plan": plan_digest(plan.ids)}

    async def _do_bulk(self, request: Request, form: dict[str, str]) -> dict[str, Any]:
        action, who = request.path_params["action"], _name(form)
        plan = await run_in_threadpool(self.engine.bulk_plan, action,
                                       _where(request.query_params))
        if not hmac.compare_digest(plan_digest(plan.ids), form.get("plan", "")):
            raise StaleWrite(f"{action}: the matching instances changed since the "
                             f"confirmation ({plan.count} match now); nothing was done: "
                             "open the confirmation page again")
        state = form.get("state") or None
        done = await run_in_threadpool(lambda: self.engine.bulk(plan, by=who, state=state))
        return {"message": f"{action}: {done.changed} changed, {done.skipped} skipped, "
                           f"{done.requested} requested ({plan.count} matched)"}

    # -- reviews -----------------------------------------------------------------------
    async def _show_review(self, request: Request) -> dict[str, Any]:
        item = await run_in_threadpool(self.engine.review, request.path_params["item"])
        return {"kind": "review", "action": "decide", "item": item,
                "change": "decides the item: the instance takes the chosen transition"}

    async def _decide(self, item: str, by: str, form: dict[str, str],
                      link: review_links.Link | None = None) -> dict[str, Any]:
        edit = _json_object(form.get("edit"), "edit")
        if link is not None:  # spent only once the form is read whole
            await run_in_threadpool(review_links.use, self.store, link, self.clock())
        try:
            rec = await run_in_threadpool(lambda: self.engine.decide(
                item, form.get("choice", ""), by=by, update=edit,
                note=form.get("note") or None, link=link and link.record()))
        except Exception:
            if link is not None:  # nothing was decided: the link works again
                await run_in_threadpool(review_links.unuse, self.store, link)
            raise
        return {"message": f"review {item}: {form.get('choice')} by {by}; instance {rec.id} "
                           f"is {rec.status} in state {rec.state}"}

    async def _do_review(self, request: Request, form: dict[str, str]) -> dict[str, Any]:
        item = await run_in_threadpool(self.engine.review, request.path_params["item"])
        return await self._decide(item.id, _name(form), form)

    def _link(self, request: Request) -> review_links.Link:
        q = request.query_params
        link = review_links.verify(self.store, request.path_params["item"], q.get("by", ""),
                                   q.get("exp", ""), q.get("sig", ""), self.clock())
        authenticated(request.scope)
        return link

    async def _gate(self, request: Request) -> None:
        """A link's ``POST`` is refused on its signature before its body is read."""
        await run_in_threadpool(self._link, request)

    async def _show_link(self, request: Request) -> dict[str, Any]:
        link = await run_in_threadpool(self._link, request)
        item = await run_in_threadpool(self.engine.review, link.item)
        if item.id != link.item:
            raise InvalidInput("this review link names no item")
        return {"kind": "review", "action": "decide", "item": item, "signed_by": link.by,
                "change": f"decides the item as {link.by} (this link works once)"}

    async def _do_link(self, request: Request, form: dict[str, str]) -> dict[str, Any]:
        link = await run_in_threadpool(self._link, request)
        return await self._decide(link.item, link.by, form, link)
