"""A provider for any OpenAI-compatible chat-completions endpoint (OpenAI, llama.cpp, vLLM...).

Configuration comes from arguments, else the environment: ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` (``"sk-no-key"`` when a base URL is set and no key is, as
local servers need none), ``FSM_MODEL``, ``FSM_HTTP_TIMEOUT`` and
``FSM_LLM_CONCURRENCY``:

- the model is required for the OpenAI API; against another server without
  one, the server's ``/v1/models`` is asked and its model used when it lists
  exactly one (``ClientError`` naming the choices otherwise);
- each request's timeout is what is left of the calling step's timeout when it
  has one (the engine passes ``timeout=``), else ``timeout`` (argument, else
  ``FSM_HTTP_TIMEOUT``, else 600 s); time spent queueing counts.  It is a deadline
  for the whole exchange (connect + head + body), also capped by ``FSM_HTTP_DEADLINE``,
  and a reply body may hold ``FSM_HTTP_MAX_BYTES`` (see ``fsm_engine.llm.http``);
- at most ``concurrency`` requests are in flight per provider (argument, else
  ``FSM_LLM_CONCURRENCY``, else 1 for a loopback server — llama.cpp's serves
  one request at a time, so more would only queue inside it until they time out —
  and 16 otherwise); the others wait their turn in order;
- a reply without ``usage`` is counted with :meth:`count_tokens` (prompt) and
  ``estimate_tokens`` (completion) and flagged ``usage_missing``.

The SDK's own retries are off: the engine owns retries.  SDK exceptions map
onto the error tree:

=================================  ====================
SDK exception                      fsm_engine error
=================================  ====================
APITimeoutError, HTTP 408          ProviderTimeout
past the exchange's deadline       DeadlineExceeded (a ProviderTimeout)
a body over FSM_HTTP_MAX_BYTES     ResponseTooLarge (not retryable)
TLS certificate verification       CertificateError (not retryable)
APIConnectionError                 ProviderUnavailable
RateLimitError (429)               RateLimited (``retry_after`` from the headers)
InternalServerError, HTTP >= 500   ServerError
other HTTP 4xx                     ClientError
anything else from the SDK         ServerError
=================================  ====================

``json_schema`` is sent per ``json_mode`` (argument, else ``$FSM_JSON_MODE``):
``"json_schema"`` (OpenAI's ``{"type": "json_schema", ...}``), ``"json_object"``
(llama.cpp server's ``{"type": "json_object", "schema": ...}``), ``"off"``, or
``"auto"`` (default): OpenAI's form first and, if the server rejects that
``response_format`` (llama-cpp-python's server answers HTTP 500), the llama.cpp
form from then on, resending that one request once.

The API key never appears in a message, a repr or a log line: it is masked
in every error text, and SDK exceptions are not chained (their request holds
the key in a header).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from fsm_engine import json_input
from fsm_engine.errors import (
    ClientError,
    InvalidInput,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    ServerError,
)
from fsm_engine.llm.base import (
    Completion,
    JsonSchema,
    Message,
    Piece,
    Provider,
    estimate_tokens,
)
from fsm_engine.llm.http import Caps, client_options, env_number
from fsm_engine.llm.sse import SseEvents
from fsm_engine.llm.tool_transcript import native_messages, tool_calls_text
from fsm_engine.policies import parse_retry_after
from fsm_engine.redaction import redact

__all__ = ["OpenAICompatible", "parse_retry_after", "is_loopback"]

log = logging.getLogger(__name__)
NO_KEY = "sk-no-key"
DEFAULT_TIMEOUT = 600.0  # seconds, the openai SDK's own default
REMOTE_CONCURRENCY = 16
JSON_MODES = ("auto", "json_schema", "json_object", "off")


def _response_format(schema: JsonSchema, mode: str) -> dict[str, Any] | None:
    """The ``response_format`` asking for JSON matching ``schema`` in ``mode`` (None: off)."""
    if mode == "off":
        return None
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or "output"))[:64]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def is_loopback(base_url: str | None) -> bool:
    """True when ``base_url`` names this machine (localhost, 127.0.0.0/8, ::1)."""
    host = urlsplit(base_url or "").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenAICompatible(Provider):
    """Chat completions over HTTP with the official ``openai`` SDK (``AsyncOpenAI``).

    ``timeout`` is the default per-request limit in seconds, ``concurrency``
    the most requests in flight, ``model`` the model id (see the module
    docstring for each one's defaults); ``json_mode`` is one of
    :data:`JSON_MODES`.  Raises ClientError at construction when no API key or
    no model can be found for the real OpenAI API, and InvalidInput for an
    unknown ``json_mode`` or a malformed environment variable.
    """

    name = "openai"

    def __init__(self, base_url: str | None = None, model: str | None = None,
                 api_key: str | None = None, timeout: float | None = None,
                 json_mode: str | None = None, concurrency: int | None = None) -> None:
        import httpx2  # the openai SDK's HTTP client
        import openai  # a core dependency; imported here to keep package import light

        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        #: ``base_url`` as messages, logs and the repr show it (credentials redacted).
        self.shown_url = redact(self.base_url) if self.base_url else "api.openai.com"
        # None until resolved from the server's model list (``resolve_model``)
        self.model: str | None = model or os.environ.get("FSM_MODEL") or None  # type: ignore[assignment]
        self.timeout = float(timeout or env_number("FSM_HTTP_TIMEOUT", float, 0.001)
                             or DEFAULT_TIMEOUT)
        self.concurrency = int(concurrency or env_number("FSM_LLM_CONCURRENCY", int, 1)
                               or (1 if is_loopback(self.base_url) else REMOTE_CONCURRENCY))
        self.json_mode = json_mode or os.environ.get("FSM_JSON_MODE") or "auto"
        if self.json_mode not in JSON_MODES:
            raise InvalidInput(f"unknown json_mode {self.json_mode!r}; "
                               f"expected one of {', '.join(JSON_MODES)}")
        key = api_key or os.environ.get("OPENAI_API_KEY") or (NO_KEY if self.base_url else None)
        if not key:
            raise ClientError("no API key for the OpenAI API: set OPENAI_API_KEY "
                              "(or OPENAI_BASE_URL for a local server)")
        if self.model is None and self.base_url is None:
            raise ClientError("no model for the OpenAI API: set FSM_MODEL (e.g. gpt-4o-mini)")
        self._secret = key
        self.caps = Caps.from_env()
        # a loopback server is reached directly, whatever HTTP(S)_PROXY says
        direct = is_loopback(self.base_url)
        # the pool the SDK's DefaultAsyncHttpxClient asks for, on the transport given to it
        limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
        http = openai.DefaultAsyncHttpxClient(
            timeout=self.timeout, **client_options(httpx2, self.caps, trust_env=not direct,
                                                   limits=limits))
        self._client = openai.AsyncOpenAI(api_key=key, base_url=self.base_url, http_client=http,
                                          timeout=self.timeout, max_retries=0)
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def __repr__(self) -> str:
        return f"OpenAICompatible(base_url={self.shown_url!r}, model={self.model!r})"

    def describe(self) -> str:
        """One line for a run's header: model, server, concurrency."""
        model = repr(self.model) if self.model else "(the server's only model)"
        return (f"openai-compatible model {model} at {self.shown_url}, "
                f"{self.concurrency} request(s) at a time")

    def _mask(self, text: str) -> str:
        """``text`` without the API key and any credential (``redaction.redact``)."""
        return redact(text.replace(self._secret, "***") if self._secret else text)

    def _semaphore(self) -> asyncio.Semaphore:
        """The concurrency gate of the running event loop (one per loop: a Semaphore is
        bound to the loop it first waits on)."""
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, asyncio.Semaphore(self.concurrency))
        return self._gate[1]

    async def resolve_model(self) -> str:
        """The model id: the configured one, else the only one ``/v1/models`` lists.

        Raises ClientError when the server lists none or several (naming them),
        or a ProviderError when it cannot be asked.
        """
        if self.model:
            return self.model
        try:
            listed = [m.id async for m in self._client.models.list()]
        except Exception as exc:  # noqa: BLE001 - mapped like a completion's failure
            raise self._map_error(exc, self.timeout) from None
        if len(listed) != 1:
            shown = ", ".join(sorted(listed)[:10]) or "none"
            raise ClientError(f"{self.name} server at {self.shown_url} lists {len(listed)} "
                              f"models ({shown}): choose one with FSM_MODEL")
        self.model = listed[0]
        log.info("%s at %s: using its only model %r", self.name, self.shown_url, self.model)
        return self.model

    def resolve_model_sync(self) -> str:
        """``resolve_model`` without an event loop (for a command's header, before a run):
        one ``GET /models`` through a short-lived client."""
        if self.model:
            return self.model
        import httpx

        url = f"{(self.base_url or '').rstrip('/')}/models"

        async def get() -> Any:
            async with httpx.AsyncClient(**client_options(httpx, self.caps)) as client:
                return await client.get(url, headers={"Authorization": f"Bearer {self._secret}"},
                                        timeout=min(self.timeout, 30.0))
        try:
            response = asyncio.run(get())  # bounded only on an event loop (llm.http)
            response.raise_for_status()
            found = json_input.parse(response.content, "the model list")  # depth-checked
            listed = [str(m.get("id")) for m in found.get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError, InvalidInput) as exc:
            raise ProviderUnavailable(f"cannot list the models at {self.shown_url}: "
                                      f"{self._mask(str(exc))[:200]} (or set FSM_MODEL)") from None
        if len(listed) != 1:
            shown = ", ".join(sorted(listed)[:10]) or "none"
            raise ClientError(f"{self.name} server at {self.shown_url} lists {len(listed)} "
                              f"models ({shown}): choose one with FSM_MODEL")
        self.model = listed[0]
        return self.model

    #: Speaks the OpenAI tool-calling protocol: ``complete(..., tools=[...])`` (agent states).
    supports_tools = True

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None, timeout: float | None = None,
                       tools: list[dict[str, Any]] | None = None,
                       tool_choice: str | dict[str, Any] | None = None) -> Completion:
        """One chat completion; ``json_schema`` goes out as ``response_format`` per ``json_mode``.

        ``tools``: OpenAI function tools (``[{"type": "function", "function": {name,
        description, parameters}}]``); a reply that calls them comes back as the text
        ``{"tool_calls": [{"name": …, "arguments": {…}}]}`` (an agent state's protocol);
        ``tool_choice`` (``"auto"``, ``"required"``, ``"none"``) goes with them.  With
        ``tools``, the prompt's text tool turns (that reply text, then the agent journal's
        ``Tool results:`` message) go out as native ``tool_calls`` and ``role: tool``
        messages (``tool_transcript.native_messages``); ``messages`` are not changed.

        ``timeout`` (seconds, e.g. what is left of the step's timeout) bounds the
        call including its wait for a free slot; None: the provider's ``timeout``.
        Raises ProviderTimeout, ProviderUnavailable, RateLimited, ServerError
        or ClientError (see the module docstring).
        """
        async with self._slot(messages, max_tokens, temperature, json_schema, stop,
                              timeout) as (left, kwargs):
            _with_tools(kwargs, messages, tools, tool_choice)
            response = await self._create(kwargs, json_schema)
        return await self._completion(response, messages)

    #: ``stream`` takes ``tools`` too: a reply's tool calls stream as their fragments come
    #: (``llm.tool_deltas``); ``runtime.calls.bill`` asks a provider without this whole.
    streams_tools = True

    async def stream(self, messages: list[Message], *, max_tokens: int = 256,
                     temperature: float = 0.0, json_schema: JsonSchema | None = None,
                     stop: list[str] | None = None, timeout: float | None = None,
                     tools: list[dict[str, Any]] | None = None,
                     tool_choice: str | dict[str, Any] | None = None) -> AsyncIterator[Piece]:
        """``complete`` over Server-Sent Events (``stream: true``): the reply's text pieces
        as the server sends them (a ``list`` of those that came in one read), then its
        ``Completion``.  The size cap and the deadline of ``llm.http`` bound the whole
        stream.  Usage is the server's last event when it sends one
        (``stream_options.include_usage``), else counted like a reply without
        ``usage``: the prompt by :meth:`count_tokens`, the reply one token per piece or
        the estimate, whichever is more (``usage_missing``).  ``tools`` and
        ``tool_choice`` as ``complete``'s: the calls' fragments
        (``delta.tool_calls[i]``) are pieces of the text ``{"tool_calls": [{"name": …,
        "arguments": …}]}`` as they come; the ``Completion``'s text is ``complete``'s of
        the same calls (their arguments parsed depth-checked: ``llm.tool_deltas``).
        Errors as ``complete``, possibly after some pieces."""
        async with self._slot(messages, max_tokens, temperature, json_schema, stop,
                              timeout) as (left, kwargs):
            _with_tools(kwargs, messages, tools, tool_choice)
            kwargs.update(stream=True, stream_options={"include_usage": True})
            opened = await self._create(kwargs, json_schema, self._open_stream)
            seen = SseEvents(f"{self.name} model {self.model!r} at {self.shown_url}")
            try:  # parsed here: the SDK's event objects cost several times the bytes
                async for pieces in seen.read(opened.iter_text()):
                    if len(pieces) > 1:  # (the events of one read: handed on together)
                        yield pieces
                    elif pieces:
                        yield pieces[0]
            except ProviderError:
                raise
            except Exception as exc:  # noqa: BLE001 - mapped like a completion's failure
                raise self._map_error(exc, left) from None
            finally:  # the connection goes back (or away) even when the caller gave up
                with contextlib.suppress(Exception):
                    await opened.close()
        if seen.tools is not None and (tail := seen.tools.close()):
            yield tail
        yield await self._streamed(seen, messages)

    @contextlib.asynccontextmanager
    async def _slot(self, messages: list[Message], max_tokens: int, temperature: float,
                    json_schema: JsonSchema | None, stop: list[str] | None,
                    timeout: float | None) -> AsyncIterator[tuple[float, dict[str, Any]]]:
        """A free slot (``max_concurrency``), held for the body: the seconds of the call's
        limit (``timeout``, else the provider's) left once it came, and the request's
        keyword arguments."""
        limit = self.timeout if timeout is None else max(0.001, float(timeout))
        started = time.monotonic()
        async with self._semaphore():
            left = self._left_after_slot(limit, started)
            yield left, await self._request(messages, max_tokens, temperature, json_schema,
                                            stop, left)

    async def _open_stream(self, **kwargs: Any) -> Any:
        """Send a streamed request; its raw response (the status checked: an error status
        raises the SDK's exception, mapped by ``_create``)."""
        return await self._client.chat.completions.with_streaming_response.create(
            **kwargs).__aenter__()

    def _left_after_slot(self, limit: float, started: float) -> float:
        """Seconds of ``limit`` left after the wait for a slot since ``started`` (monotonic)."""
        if (left := limit - (time.monotonic() - started)) <= 0:
            raise ProviderTimeout(f"{self.name} call waited {limit:g}s for a free slot "
                                  f"(concurrency {self.concurrency})")
        return left

    async def _request(self, messages: list[Message], max_tokens: int, temperature: float,
                       json_schema: JsonSchema | None, stop: list[str] | None,
                       left: float) -> dict[str, Any]:
        """The SDK's keyword arguments for one chat completion."""
        kwargs: dict[str, Any] = {"model": await self.resolve_model(), "messages": messages,
                                  "max_tokens": max_tokens, "temperature": temperature,
                                  "timeout": left}
        if stop:
            kwargs["stop"] = stop
        if json_schema is not None and self.json_mode != "off":
            kwargs["response_format"] = _response_format(json_schema, self.json_mode)
        return kwargs

    async def _streamed(self, seen: SseEvents, messages: list[Message]) -> Completion:
        """The ``Completion`` of a streamed reply from what its events said."""
        calls = seen.tools.text() if seen.tools is not None else None
        text = calls or "".join(seen.parts)  # (as ``complete``: calls, else the text)
        prompt, completion = seen.prompt, seen.completion
        missing = prompt is None or completion is None
        if missing:
            counted = self.count_tokens(messages)
            prompt = await counted if inspect.isawaitable(counted) else counted
            pieces = len(seen.parts) + (seen.tools.fragments if seen.tools is not None else 0)
            completion = max(pieces, estimate_tokens(text))
        return Completion(text=text, prompt_tokens=int(prompt or 0),
                          completion_tokens=int(completion or 0),
                          finish_reason=seen.finish or "stop",
                          model=seen.model or self.model or "?", usage_missing=missing)

    async def _create(self, kwargs: dict[str, Any], schema: JsonSchema | None,
                      send: Any = None) -> Any:
        """Send the request (``send``: the SDK's ``create``, or ``_open_stream``); auto mode
        resends once in llama.cpp form if json_schema is refused."""
        send = send or self._client.chat.completions.create
        try:
            return await send(**kwargs)
        except Exception as exc:  # noqa: BLE001 - every SDK failure is mapped below
            if not self._refused_json_schema(exc, kwargs):
                raise self._map_error(exc, kwargs["timeout"]) from None
        self.json_mode = "json_object"
        log.info("%s at %s refused response_format json_schema; using json_object",
                 self.name, self.shown_url)
        kwargs["response_format"] = _response_format(schema or {}, self.json_mode)
        try:
            return await send(**kwargs)
        except Exception as exc:  # noqa: BLE001
            raise self._map_error(exc, kwargs["timeout"]) from None

    def _refused_json_schema(self, exc: Exception, kwargs: dict[str, Any]) -> bool:
        sent = (kwargs.get("response_format") or {}).get("type")
        status = getattr(exc, "status_code", None)
        return (self.json_mode == "auto" and sent == "json_schema"
                and status in (400, 422, 500) and "json_schema" in str(exc))

    async def _completion(self, response: Any, messages: list[Message]) -> Completion:
        usage = getattr(response, "usage", None)
        prompt = getattr(usage, "prompt_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
        choices = getattr(response, "choices", None)
        text = tool_calls_text(choices[0].message) or (choices[0].message.content or "") \
            if choices else ""
        missing = not isinstance(prompt, int) or not isinstance(completion, int)
        if missing:  # never a silent 0: the prompt by the tokenizer, the reply estimated
            counted = self.count_tokens(messages)
            prompt = await counted if inspect.isawaitable(counted) else counted
            completion = estimate_tokens(text)
        tokens = {"prompt_tokens": int(prompt or 0), "completion_tokens": int(completion or 0)}
        if not choices:
            raise ServerError(f"{self.name} model {self.model!r} returned no choices", **tokens)
        return Completion(text=text, **tokens,
                          finish_reason=choices[0].finish_reason or "stop",
                          model=response.model or self.model or "?", usage_missing=missing)

    def _map_error(self, exc: Exception, timeout: float) -> ProviderError:
        """Turn an SDK exception into the matching ProviderError, key masked."""
        import openai

        where = f"{self.name} model {self.model!r} at {self.shown_url}"
        detail = self._mask(" ".join(str(getattr(exc, "message", exc)).split()))[:300]
        status = getattr(exc, "status_code", None)
        log.debug("provider call failed: %s: %s", type(exc).__name__, detail)
        if isinstance(exc, ProviderError):  # the bounded transport's: too large, late, cert
            return type(exc)(f"{where}: {detail}", status=status)
        if isinstance(exc, openai.APITimeoutError) or status == 408 or _transport(exc, "Timeout"):
            return ProviderTimeout(f"{where} timed out after {timeout:.3g}s", status=status)
        if isinstance(exc, openai.APIConnectionError):
            return ProviderUnavailable(f"{where} unreachable: {detail}")
        if isinstance(exc, openai.RateLimitError) or status == 429:
            wait = parse_retry_after(exc.response.headers)  # type: ignore[attr-defined]
            after = "" if wait is None else f", retry after {wait:g}s"
            return RateLimited(f"{where} rate limited (HTTP 429{after}): {detail}",
                               status=429, retry_after=wait)
        if isinstance(exc, openai.InternalServerError) or (status or 0) >= 500:
            return ServerError(f"{where} server error (HTTP {status}): {detail}", status=status)
        if isinstance(exc, openai.APIStatusError):
            return ClientError(f"{where} rejected the request (HTTP {status}): {detail}",
                               status=status)
        if isinstance(exc, RecursionError):  # the SDK's json read a reply nested too deep
            return ServerError(f"{where} sent a reply that nests too deep to read")
        if isinstance(exc, (openai.OpenAIError, ValueError)) or _transport(exc):
            return ServerError(f"{where} failed: {type(exc).__name__}: {detail}")
        raise exc

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()


def _with_tools(kwargs: dict[str, Any], messages: list[Message],
                tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None) -> None:
    """With ``tools``: them (and ``tool_choice``) in the request's ``kwargs``, and the
    journal's text tool turns as the protocol's own, on the wire only (``messages`` are not
    changed: ``tool_transcript.native_messages``)."""
    if tools:
        kwargs["tools"], kwargs["messages"] = tools, native_messages(messages)
        if tool_choice:
            kwargs["tool_choice"] = tool_choice


def _transport(exc: Exception, kind: str = "TransportError") -> bool:
    """True for the SDK's HTTP client (httpx or httpx2) failing under a read it does not
    wrap, a streamed body: ``kind`` ``TransportError`` (cut short: ``RemoteProtocolError``,
    ``ReadError``) or ``Timeout`` (``TimeoutException``)."""
    return any(c.__name__.startswith(kind) and c.__module__.startswith("httpx")
               for c in type(exc).__mro__)
