"""``fsm serve``: the HTTP door for other services (issue 38 item 7).

A JSON API over one engine, for the machines named on the command line only:

- ``POST /api/machines/{name}/instances``: start one (body ``{"input": {…}, "priority": N,
  "delay": S}``, the last two optional; an ``Idempotency-Key`` header is the start's key):
  201 ``{"id", "machine", "created": true}``, or 200 with ``"created": false`` when the key
  named an instance already started with that input.  Enqueued: an ``fsm worker`` runs it.
- ``POST /api/instances/{id}/send``: ``{"trigger": T, "payload": {…}}``, as ``fsm send``.
- ``GET /api/instances/{id}``: status, state, reason, context, times (``instance_view``).
- ``GET /api/instances/{id}/stream``: its stream as Server-Sent Events (``ui.stream``).
- ``GET /api/openapi.json``: the OpenAPI 3.1 document of all this (``ui.api_doc``).

Every request needs ``Authorization: Bearer TOKEN`` (``app.TokenGate``, compared with
``hmac.compare_digest``; no query string, no cookie) and a ``Host`` the server serves
(``hosts.HostGate``).  A body is at most ``Limits.max_body`` bytes (a larger
``Content-Length`` is refused before a byte is read) and must arrive whole within
``Limits.body_s`` seconds; the work of a request (all but a stream) must end within
``Limits.request_s`` seconds, else 504 (a write it made stays made: retry a start with
its ``Idempotency-Key``).  Every error is ``{"error": {"code": C, "message": M}}``
(``CODES``); messages have credentials redacted.  Every write goes through the engine
(its ledger); a send's history row names ``ACTOR`` (``detail.operator``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import json_input
from ..errors import (
    FsmError,
    InstanceFinished,
    InstanceNotFound,
    InvalidInput,
    StaleWrite,
    StartConflict,
)
from ..redaction import redact
from ..runtime import start_options
from ..runtime.client import validate_input
from ..runtime.start_options import StartOptions
from ..store.records import InstanceRecord
from . import api_doc
from .app import TokenGate
from .headers import SECURITY_HEADERS, Secured
from .hosts import HostGate, HostRule
from .stream import stream_endpoint

__all__ = ["create_api", "Limits", "ApiError", "instance_view", "ACTOR", "CODES"]

#: Who a write through the API was made by (``detail.operator`` of its history row).
ACTOR = "api"
#: Each error code and its status (the stable part of an error; messages may change).
CODES = {
    "bad_request": 400, "invalid_json": 400, "not_an_object": 400, "unauthorized": 401,
    "not_found": 404, "method_not_allowed": 405, "body_timeout": 408, "conflict": 409,
    "not_waiting": 409, "key_conflict": 409, "body_too_large": 413, "invalid_input": 422,
    "misdirected": 421, "internal": 500, "unavailable": 503, "deadline_exceeded": 504,
}
#: Most characters of an ``Idempotency-Key`` (a start key).
MAX_KEY = start_options.MAX_KEY


@dataclass(frozen=True)
class Limits:
    """The API's bounds: ``max_body`` bytes of a request body, ``body_s`` seconds for it
    to arrive whole, ``request_s`` seconds for a request's work (streams excepted)."""

    max_body: int = 1024 * 1024
    body_s: float = 10.0
    request_s: float = 30.0


class ApiError(FsmError):
    """An error answered as ``{"error": {"code", "message"}}`` with ``CODES[code]`` (in
    the one error tree: an ``FsmError``, its message one line)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats as strings (a database written before values were
    checked may hold a bare NaN: never sent as a non-standard token)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def reply(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """``data`` as strict JSON with the security headers."""
    try:
        body = json.dumps(data, ensure_ascii=False, allow_nan=False)
    except ValueError:
        body = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False)
    return Response(body, status, headers=SECURITY_HEADERS | dict(headers or {}),
                    media_type="application/json")


def error(code: str, message: str, headers: Mapping[str, str] | None = None,
          status: int | None = None) -> Response:
    """The error response of ``code`` (its status from ``CODES`` unless ``status``)."""
    return reply({"error": {"code": code, "message": message}},
                 status or CODES[code], headers)


def _stream_refusal(status: int, code: str, message: str, headers: dict[str, str]) -> Response:
    return error(code, message, headers, status)


async def read_json(request: Request, limits: Limits) -> dict[str, Any]:
    """The request's body as a JSON object, read within the bounds (``ApiError``:
    ``body_too_large``, ``body_timeout``, ``invalid_json``, ``not_an_object``)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limits.max_body:
        raise ApiError("body_too_large", f"a request body is at most {limits.max_body} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(limits.body_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limits.max_body:
                    raise ApiError("body_too_large",
                                   f"a request body is at most {limits.max_body} bytes")
    except TimeoutError:
        raise ApiError("body_timeout", f"the body did not arrive within {limits.body_s:g} s"
                       ) from None
    except ClientDisconnect:
        raise ApiError("bad_request", "the body did not arrive") from None
    try:
        value = json_input.parse(bytes(body), "the request body")
    except InvalidInput as exc:
        raise ApiError("invalid_json", str(exc)) from None
    if not isinstance(value, dict):
        raise ApiError("not_an_object", "the request body must be a JSON object")
    return value


def _fields(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(body) - set(allowed))
    if extra:
        raise ApiError("bad_request", f"unknown field(s) {', '.join(map(repr, extra))}; "
                                      f"this body takes {', '.join(allowed)}")


def instance_view(rec: InstanceRecord) -> dict[str, Any]:
    """What ``GET /api/instances/{id}`` answers: ``{id, machine, status, state, reason,
    context, created_at, updated_at, due_at, deadline, priority, key, tokens_used,
    token_budget, parent_id}``; times are epoch seconds, ``due_at`` when it next runs by
    itself (a delayed start while ``scheduled``, a retry, a rate wait; ``None``: not by the
    clock); ``key`` its start key (``Idempotency-Key``)."""
    return {"id": rec.id, "machine": rec.machine, "status": rec.status, "state": rec.state,
            "reason": rec.reason, "context": rec.context, "created_at": rec.created_at,
            "updated_at": rec.updated_at, "due_at": rec.next_attempt_at,
            "deadline": rec.deadline, "priority": rec.priority, "key": rec.start_key,
            "tokens_used": rec.tokens_used, "token_budget": rec.token_budget,
            "parent_id": rec.parent_id}


def _status_of(exc: FsmError) -> str:
    """The code of an engine error a write raised."""
    if isinstance(exc, InstanceNotFound):
        return "not_found"
    if isinstance(exc, (StaleWrite, InstanceFinished)):
        return "conflict"
    return "invalid_input" if isinstance(exc, InvalidInput) else "unavailable"


class Api:
    """The routes over ``engine`` serving ``machines`` (name → ``CompiledMachine``)."""

    def __init__(self, engine: Any, machines: Mapping[str, Any], limits: Limits,
                 start: Callable[..., tuple[str, bool]],
                 audit: Callable[[str], None] | None = None) -> None:
        self.engine, self.store, self.machines = engine, engine.store, dict(machines)
        self.audit = audit or (lambda line: None)
        #: The machines whose instances may be read and sent to: those served and their
        #: fan-outs' branch machines (a served instance's children).
        self.readable = {m.name for cm in self.machines.values() for m in cm.family()}
        self.limits, self.start_fn = limits, start
        self.doc = api_doc.document(self.machines, limits)

    def _machine(self, name: str) -> Any:
        cm = self.machines.get(name)
        if cm is None:
            raise ApiError("not_found", f"this server serves no machine {name[:100]!r}")
        return cm

    async def _served(self, instance_id: str) -> InstanceRecord:
        """The instance, if its machine is served here or is a branch machine of one (else
        ``not_found``, as unknown)."""
        try:
            rec = await run_in_threadpool(self.store.get, instance_id)
        except InstanceNotFound:
            rec = None
        if rec is None or rec.machine not in self.readable:
            raise ApiError("not_found", f"no instance {instance_id[:100]!r}")
        return rec

    async def start(self, request: Request) -> Response:
        cm = self._machine(request.path_params["name"])
        key = request.headers.get("idempotency-key")
        if key is not None and not (0 < len(key) <= MAX_KEY and key.isprintable()):
            raise ApiError("bad_request", f"an Idempotency-Key is 1 to {MAX_KEY} printable "
                                          "characters")
        body = await read_json(request, self.limits)
        _fields(body, ("input", "priority", "delay"))
        options = options_of(body, key, self.engine.clock())
        data = body.get("input", {})
        if not isinstance(data, dict):
            raise ApiError("not_an_object", "'input' must be a JSON object")
        try:
            validate_input(cm.spec.context, data)  # 422 before anything is written
            iid, created = await run_in_threadpool(self.start_fn, self.engine, cm.spec, data,
                                                   options)
        except ApiError:
            raise  # already answered with its own code (an FsmError too)
        except FsmError as exc:
            raise ApiError(_status_of(exc), redact(exc)) from None
        self.audit(f"start {cm.spec.name} {iid} {'created' if created else 'existing'}"
                   + (f" key {key}" if key is not None else "") + _peer(request))
        return reply({"id": iid, "machine": cm.spec.name, "created": created},
                     201 if created else 200)

    async def send(self, request: Request) -> Response:
        rec = await self._served(request.path_params["instance_id"])
        body = await read_json(request, self.limits)
        _fields(body, ("trigger", "payload"))
        trigger, payload = body.get("trigger"), body.get("payload", {})
        if not isinstance(trigger, str) or not trigger:
            raise ApiError("bad_request", "'trigger' must be a trigger's name")
        if not isinstance(payload, dict):
            raise ApiError("not_an_object", "'payload' must be a JSON object")
        if rec.status != "waiting":
            raise ApiError("not_waiting", f"instance {rec.id} is {rec.status}, not waiting")
        try:
            rec = await self.engine.signal(rec.id, trigger, payload, operator=ACTOR)
        except FsmError as exc:
            raise ApiError(_status_of(exc), redact(exc)) from None
        self.audit(f"send {trigger} {rec.id} now {rec.status} in {rec.state}" + _peer(request))
        return reply({"id": rec.id, "status": rec.status, "state": rec.state})

    async def get(self, request: Request) -> Response:
        return reply(instance_view(await self._served(request.path_params["instance_id"])))

    async def openapi(self, request: Request) -> Response:
        return reply(self.doc)

    def routes(self) -> list[Route]:
        """The API's routes: each answers within ``request_s`` (``bounded``), the stream
        excepted (it lasts as long as the instance runs)."""
        stream = stream_endpoint(self.store, _stream_refusal)

        async def streamed(request: Request) -> Response:
            await self._served(request.path_params["instance_id"])
            return await stream(request)
        b = self.bounded
        return [Route("/api/machines/{name}/instances", b(self.start), methods=["POST"]),
                Route("/api/instances/{instance_id}/send", b(self.send), methods=["POST"]),
                Route("/api/instances/{instance_id}/stream", self.guard(streamed),
                      methods=["GET"]),
                Route("/api/instances/{instance_id}", b(self.get), methods=["GET"]),
                Route("/api/openapi.json", b(self.openapi), methods=["GET"])]

    def guard(self, fn: Callable[[Request], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
        """``fn`` with its ``ApiError`` answered as the error it names."""
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(request)
            except ApiError as exc:
                return error(exc.code, exc.message)
        return endpoint

    def bounded(self, fn: Callable[[Request], Awaitable[Response]]
                ) -> Callable[[Request], Awaitable[Response]]:
        """``guard(fn)`` answered 504 past ``request_s`` seconds."""
        guarded = self.guard(fn)

        async def endpoint(request: Request) -> Response:
            try:
                return await asyncio.wait_for(guarded(request), self.limits.request_s)
            except TimeoutError:
                return error("deadline_exceeded", f"the request took over "
                                                  f"{self.limits.request_s:g} s")
        return endpoint


def _peer(request: Request) -> str:
    """`` from HOST`` naming the client's address (empty when the server gives none)."""
    return f" from {request.client.host}" if request.client else ""


def options_of(body: dict[str, Any], key: str | None, now: float) -> StartOptions:
    """The start's options at ``now`` (epoch seconds) from the body and the
    ``Idempotency-Key``: ``key``, ``priority`` (an integer), ``delay`` (seconds ≥ 0), checked
    by ``start_options.check``; ``ApiError`` (``bad_request``) when malformed."""
    priority, delay = body.get("priority", 0), body.get("delay")
    if priority is None:
        priority = 0
    try:
        return start_options.check(now, key=key, delay=delay, priority=priority)
    except InvalidInput as exc:
        raise ApiError("bad_request", redact(exc)) from None


def start(engine: Any, machine: Any, data: dict[str, Any], options: StartOptions
          ) -> tuple[str, bool]:
    """Enqueue one instance of ``machine`` (the ``Machine`` the engine loaded) with the
    input ``data`` and the checked ``options`` for the workers: (the id of the instance
    standing for it, True when this start created it; False: its key named one started
    before with the same input).  ``ApiError`` (``key_conflict``) when the key names one
    started with another input.  The one place the API's start options meet the engine."""
    new = os.urandom(6).hex()
    try:
        held = engine.start_many(machine, [data], enqueue=True, ids=[new], options=options)[0]
    except StartConflict as exc:
        raise ApiError("key_conflict", redact(exc)) from None
    return held, held == new


def _not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return error("method_not_allowed", f"{request.method} is not allowed here")
    return error("not_found", "no such route")


def _internal(request: Request, exc: Exception) -> Response:
    """A fault nobody expected: the JSON 500 (the exception goes on to the server's log)."""
    return error("internal", "the server failed to answer this request")


def create_api(engine: Any, machines: Mapping[str, Any], *, token: str,
               hosts: HostRule | None = None, limits: Limits = Limits(),
               start_fn: Callable[..., tuple[str, bool]] = start,
               audit: Callable[[str], None] | None = None) -> Any:
    """The API's ASGI app over ``engine`` for ``machines`` (name → the ``CompiledMachine``
    the engine loaded), behind ``token`` (required: ``InvalidInput`` when blank or not one
    word) and, with ``hosts``, the ``Host`` check; ``start_fn``: how a start reaches the
    engine (``start``); ``audit``: called with one line per write made (a start: machine,
    id, ``created``/``existing``, its key; a send: trigger, id, the status and state it left;
    each with the client's address) — ``fsm serve`` prints them (a send's history row names
    ``ACTOR`` too; a start writes no history row, its line is its audit)."""
    if not token or any(c.isspace() for c in token):
        raise InvalidInput("the API's token is one word: no spaces, not blank")
    api = Api(engine, machines, limits, start_fn, audit)
    app = Starlette(routes=api.routes(),
                    exception_handlers={404: _not_found, 405: _not_found,
                                        Exception: _internal})

    def denied() -> Response:
        return error("unauthorized", "this API needs its token (Authorization: Bearer …)",
                     {"WWW-Authenticate": 'Bearer realm="fsm"'})

    def misdirected() -> Response:
        return error("misdirected", "this server does not serve that Host (fsm serve "
                                    "--allowed-host NAME serves a name)")
    gated: Any = TokenGate(app, token, browser=False, denied=denied)
    if hosts is not None:
        gated = HostGate(gated, hosts, misdirected)
    failed = json.dumps({"error": {"code": "internal", "message": "the server failed to "
                                   "answer this request"}}).encode()
    return Secured(gated, (b"application/json", failed))
