"""A provider for any OpenAI-compatible chat-completions endpoint (OpenAI, llama.cpp, vLLM...).

Configuration comes from arguments, else the environment: ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` (``"sk-no-key"`` when a base URL is set and no key is, as
local servers need none) and ``FSM_MODEL``.  The SDK's own retries are off:
the engine owns retries.  SDK exceptions map onto the error tree:

=================================  ====================
SDK exception                      fsm_engine error
=================================  ====================
APITimeoutError, HTTP 408          ProviderTimeout
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

import logging
import os
import re
import time
from email.utils import parsedate_to_datetime
from collections.abc import Mapping
from typing import Any

from fsm_engine.errors import (ClientError, InvalidInput, ProviderError, ProviderTimeout,
                               ProviderUnavailable, RateLimited, ServerError)
from fsm_engine.llm.base import Completion, JsonSchema, Message, Provider

__all__ = ["OpenAICompatible", "parse_retry_after"]

log = logging.getLogger(__name__)
DEFAULT_MODEL = "gpt-4o-mini"
NO_KEY = "sk-no-key"
JSON_MODES = ("auto", "json_schema", "json_object", "off")


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP-date).

    Returns None when neither header is present or parseable; never negative.
    """
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def _response_format(schema: JsonSchema, mode: str) -> dict[str, Any] | None:
    """The ``response_format`` asking for JSON matching ``schema`` in ``mode`` (None: off)."""
    if mode == "off":
        return None
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or "output"))[:64]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


class OpenAICompatible(Provider):
    """Chat completions over HTTP with the official ``openai`` SDK (``AsyncOpenAI``).

    ``timeout`` is the per-request limit in seconds; ``json_mode`` is one of
    :data:`JSON_MODES` (see the module docstring).  Raises ClientError at
    construction when no API key can be found for the real OpenAI API, and
    InvalidInput for an unknown ``json_mode``.
    """

    name = "openai"

    def __init__(self, base_url: str | None = None, model: str | None = None,
                 api_key: str | None = None, timeout: float = 60.0,
                 json_mode: str | None = None) -> None:
        import openai  # a core dependency; imported here to keep package import light

        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.model = model or os.environ.get("FSM_MODEL") or DEFAULT_MODEL
        self.timeout = timeout
        self.json_mode = json_mode or os.environ.get("FSM_JSON_MODE") or "auto"
        if self.json_mode not in JSON_MODES:
            raise InvalidInput(f"unknown json_mode {self.json_mode!r}; "
                               f"expected one of {', '.join(JSON_MODES)}")
        key = api_key or os.environ.get("OPENAI_API_KEY") or (NO_KEY if self.base_url else None)
        if not key:
            raise ClientError("no API key for the OpenAI API: set OPENAI_API_KEY "
                              "(or OPENAI_BASE_URL for a local server)")
        self._secret = key
        self._client = openai.AsyncOpenAI(api_key=key, base_url=self.base_url,
                                          timeout=timeout, max_retries=0)

    def __repr__(self) -> str:
        return f"OpenAICompatible(base_url={self.base_url!r}, model={self.model!r})"

    def _mask(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None) -> Completion:
        """One chat completion; ``json_schema`` goes out as ``response_format`` per ``json_mode``.

        Raises ProviderTimeout, ProviderUnavailable, RateLimited, ServerError
        or ClientError (see the module docstring).
        """
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages,
                                  "max_tokens": max_tokens, "temperature": temperature}
        if stop:
            kwargs["stop"] = stop
        if json_schema is not None and self.json_mode != "off":
            kwargs["response_format"] = _response_format(json_schema, self.json_mode)
        return self._completion(await self._create(kwargs, json_schema))

    async def _create(self, kwargs: dict[str, Any], schema: JsonSchema | None) -> Any:
        """Send the request; auto mode resends once in llama.cpp form if json_schema is refused."""
        try:
            return await self._client.chat.completions.create(**kwargs)
        except Exception as exc:  # noqa: BLE001 - every SDK failure is mapped below
            if not self._refused_json_schema(exc, kwargs):
                raise self._map_error(exc) from None
        self.json_mode = "json_object"
        log.info("%s at %s refused response_format json_schema; using json_object",
                 self.name, self.base_url)
        kwargs["response_format"] = _response_format(schema or {}, self.json_mode)
        try:
            return await self._client.chat.completions.create(**kwargs)
        except Exception as exc:  # noqa: BLE001
            raise self._map_error(exc) from None

    def _refused_json_schema(self, exc: Exception, kwargs: dict[str, Any]) -> bool:
        sent = (kwargs.get("response_format") or {}).get("type")
        status = getattr(exc, "status_code", None)
        return (self.json_mode == "auto" and sent == "json_schema"
                and status in (400, 422, 500) and "json_schema" in str(exc))

    def _completion(self, response: Any) -> Completion:
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        if not getattr(response, "choices", None):
            raise ServerError(f"{self.name} model {self.model!r} returned no choices",
                              prompt_tokens=prompt, completion_tokens=completion)
        choice = response.choices[0]
        return Completion(text=choice.message.content or "", prompt_tokens=prompt,
                          completion_tokens=completion,
                          finish_reason=choice.finish_reason or "stop",
                          model=response.model or self.model)

    def _map_error(self, exc: Exception) -> ProviderError:
        """Turn an SDK exception into the matching ProviderError, key masked."""
        import openai

        where = f"{self.name} model {self.model!r} at {self.base_url or 'api.openai.com'}"
        detail = self._mask(" ".join(str(getattr(exc, "message", exc)).split()))[:300]
        status = getattr(exc, "status_code", None)
        log.debug("provider call failed: %s: %s", type(exc).__name__, detail)
        if isinstance(exc, openai.APITimeoutError) or status == 408:
            return ProviderTimeout(f"{where} timed out after {self.timeout:g}s", status=status)
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
        if isinstance(exc, (openai.OpenAIError, ValueError)):
            return ServerError(f"{where} failed: {type(exc).__name__}: {detail}")
        raise exc

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()
