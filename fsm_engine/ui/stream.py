"""``GET /instances/{id}/stream``: an instance's stream as Server-Sent Events.

Each event is one ``runtime.stream_read.StreamEvent`` as JSON in ``data:`` (its ``kind``
inside: chunk, open, end, error, superseded, step, final), with ``id:`` its cursor, so a
client that reconnects (``EventSource`` sends ``Last-Event-ID``; a plain client may give
``?from=N`` or ``?from=N:S``) resumes with no gap and no repeat.  The response ends after
the ``final`` event (whose cursor, ``P:S:0``, is its own: a reconnect with it is answered
204, which stops an ``EventSource``), or after one ``fsm-error`` event (``{"error": …}``:
the database went away, or a stored row is malformed), on which the page's script stops.
Events are made as the client takes them: the response awaits each send, so a client that
stops reading holds at most one batch of rows and the server's socket buffer, and slows
nothing else.  A GET that changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import InstanceNotFound, InvalidInput, StoreError
from ..redaction import redact
from ..runtime.stream_read import Subscription, check_start, ended, events, parse_cursor
from .headers import SECURITY_HEADERS

__all__ = ["stream_endpoint", "stop_all", "RETRY_MS"]

#: How long an ``EventSource`` waits before reconnecting (milliseconds).
RETRY_MS = 1000
#: Most streams one viewer serves at once; more get 503 (each holds a connection and, on
#: PostgreSQL, a thread while it waits for a NOTIFY).
MAX_STREAMS = 32


#: The streams being served in this process (``stop_all`` ends them).
_SERVED: set[Subscription] = set()


def stop_all() -> None:
    """End every stream this process serves at its next wait for rows (the viewer is
    stopping: its responses end, so the server's shutdown does not wait on them)."""
    for sub in list(_SERVED):
        sub.stop()


async def _sse(store: Any, instance_id: str, start: str, open_: list[int]) -> AsyncIterator[str]:
    open_[0] += 1  # counted once running: a response never started holds nothing
    sub = events(store, instance_id, start)
    _SERVED.add(sub)
    try:
        yield f"retry: {RETRY_MS}\n\n"
        async for ev in sub:
            # ensure_ascii: no raw line break (nor anything else) can end a data line early
            yield f"id: {ev.cursor}\ndata: {json.dumps(ev.as_json(), ensure_ascii=True)}\n\n"
    except StoreError as exc:  # the database went away: say so, end the response
        yield f"event: fsm-error\ndata: {json.dumps({'error': redact(exc)})}\n\n"
    finally:
        _SERVED.discard(sub)
        open_[0] -= 1


#: An endpoint's error response: (status, code, message, extra headers) -> response.
Refuse = Callable[[int, str, str, dict[str, str]], Response]


def _refuse(status: int, code: str, message: str, headers: dict[str, str]) -> Response:
    """The viewer's error: ``{"error": message}`` (``code`` unused)."""
    return JSONResponse({"error": message}, status, headers=SECURITY_HEADERS | headers)


#: The code each status of the endpoint's refusals carries.
CODES = {400: "bad_request", 404: "not_found", 503: "unavailable"}


def stream_endpoint(store: Any, refuse: Refuse = _refuse
                    ) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint over ``store``: 404 for an unknown instance, 400 for a bad offset (or
    one past the end of the log), 204 for a resume from the ``final`` event's cursor
    (nothing more: an ``EventSource`` stops reconnecting), 503
    past ``MAX_STREAMS`` at once; ``refuse`` makes those errors' responses (``CODES``)."""
    open_ = [0]  # streams being served

    async def endpoint(request: Request) -> Response:
        instance_id = request.path_params["instance_id"]
        start = (request.headers.get("last-event-id")
                 or request.query_params.get("from") or "0")
        try:
            pos = parse_cursor(start)[0]
            await run_in_threadpool(store.get, instance_id)
            await run_in_threadpool(check_start, store, instance_id, pos)
            if await run_in_threadpool(ended, store, instance_id, start):  # (past final)
                return Response(status_code=204, headers=SECURITY_HEADERS)
        except (InstanceNotFound, InvalidInput, StoreError) as exc:
            code = 404 if isinstance(exc, InstanceNotFound) else (
                400 if isinstance(exc, InvalidInput) else 503)
            return refuse(code, CODES[code], redact(exc), {})
        if open_[0] >= MAX_STREAMS:
            return refuse(503, CODES[503], f"this server serves {MAX_STREAMS} streams at once",
                          {"Retry-After": "5"})
        return StreamingResponse(_sse(store, instance_id, start, open_),
                                 media_type="text/event-stream",
                                 headers=SECURITY_HEADERS | {"X-Accel-Buffering": "no"})
    return endpoint
