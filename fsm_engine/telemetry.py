"""OpenTelemetry traces (optional extra ``[otel]``): a span per instance run, per step and
per model call.

This module uses the OpenTelemetry API alone, as a library should: spans go to the tracer
provider the process installed (:func:`installed_tracer`), and without one tracing is off
and free (the engine keeps ``tracer = None``; each step costs one ``if``).  The SDK is set
up only when asked: by the application itself, or by :func:`fsm_engine.telemetry_sdk.configure`
from the standard ``OTEL_*`` variables, which the ``fsm`` commands call at start (they own
their process; a library user's process is left as it is).

Spans (attribute names: ``fsm.*`` for the engine's own, the GenAI semantic
conventions for model calls):

* ``fsm.run`` — one ``Engine.run`` of one instance: ``fsm.machine``,
  ``fsm.instance_id``, ``fsm.status``, ``fsm.state``, ``fsm.tokens``;
* ``fsm.step`` — its child, one per step: ``fsm.machine``, ``fsm.instance_id``,
  ``fsm.state`` (the state stepped), ``fsm.trigger``, ``fsm.dest``,
  ``fsm.attempt``, ``fsm.tokens`` (billed in the step), ``fsm.outcome``
  (``transition``, ``fallback``, ``skip``, ``retry``, ``fail``, ``loop_limit``,
  ``waiting`` …), ``error.type`` (the error's class) when the step failed;
* ``chat {model}`` — child of its step, one per model call:
  ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
  ``gen_ai.request.max_tokens``, ``gen_ai.request.temperature``,
  ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``,
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``, ``error.type``;
* ``execute_tool {name}`` — child of its step, one per tool call of an agent state:
  ``gen_ai.operation.name`` (``execute_tool``), ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type`` (``function``), ``error.type`` when the
  call's result is an error.

No prompt or reply text is put in a span unless
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def installed_tracer(env: os._Environ[str] | dict[str, str] | None = None) -> Any:
    """The ``fsm_engine`` tracer of the tracer provider this process installed, or None
    (tracing off: no provider installed, ``OTEL_SDK_DISABLED=true``, or OpenTelemetry never
    imported, in which case nothing is imported now either).

    Uses the OpenTelemetry API alone: the application (or :mod:`fsm_engine.telemetry_sdk`,
    which ``fsm`` commands call when ``OTEL_*`` variables ask for traces) installs the SDK.
    """
    import sys
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if "opentelemetry.trace" not in sys.modules:
        return None  # nobody can have installed a provider: stay free
    from opentelemetry import trace
    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return None
    return provider.get_tracer("fsm_engine")


def _set(span: Any, attrs: dict[str, Any]) -> None:
    span.set_attributes({k: v for k, v in attrs.items() if v is not None})


async def traced_run(tracer: Any, run: Callable[..., Awaitable[Any]], instance_id: str,
                     *args: Any) -> Any:
    """``await run(instance_id, *args)`` inside an ``fsm.run`` span (the record's facts
    are added when it returns; an exception is recorded and re-raised)."""
    with tracer.start_as_current_span("fsm.run", attributes={"fsm.instance_id": instance_id}) as span:
        rec = await run(instance_id, *args)
        _set(span, {"fsm.machine": rec.machine, "fsm.status": rec.status,
                    "fsm.state": rec.state, "fsm.tokens": rec.tokens_used})
        return rec


async def traced_step(tracer: Any, decide: Callable[..., Awaitable[Any]],
                      commit: Callable[..., Awaitable[Any]], cm: Any, rec: Any) -> Any:
    """``commit(rec, await decide(cm, rec))`` inside an ``fsm.step`` span, with the
    outcome's attributes; an exception is recorded (``error.type``) and re-raised."""
    attrs = {"fsm.machine": rec.machine, "fsm.instance_id": rec.id, "fsm.state": rec.state,
             "fsm.attempt": rec.attempt}
    with tracer.start_as_current_span("fsm.step", attributes=attrs) as span:
        try:
            step = await decide(cm, rec)
            new = await commit(rec, step)
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            raise
        _set(span, outcome_attributes(rec, new, step))
        return new


def outcome_attributes(rec: Any, new: Any, commit: Any) -> dict[str, Any]:
    """The ``fsm.step`` attributes known once a step committed."""
    attrs: dict[str, Any] = {"fsm.tokens": new.tokens_used - rec.tokens_used}
    rows = list(getattr(commit, "history", None) or ())
    attempt = getattr(commit, "attempt", None)
    if rows:
        first = rows[0]
        attrs.update({"fsm.trigger": first.trigger, "fsm.dest": rows[-1].dest,
                      "fsm.outcome": rows[-1].kind})
        if first.error:
            attrs["error.type"] = first.error.split(":", 1)[0]
    elif attempt is not None:
        attrs.update({"fsm.outcome": "retry", "error.type": attempt.error_class})
    else:
        attrs["fsm.outcome"] = new.status
    return attrs


async def traced_call(tracer: Any, parent: Any, call: Callable[..., Awaitable[Any]],
                      provider: Any, messages: list[dict[str, str]], kwargs: dict[str, Any]) -> Any:
    """``await call(messages, **kwargs)`` inside a ``chat {model}`` span, child of ``parent``
    (an OpenTelemetry context, so sync actions in worker threads nest right too)."""
    from opentelemetry.trace import SpanKind
    model = str(getattr(provider, "model", "") or "unknown")
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name":
             str(getattr(provider, "name", "") or "unknown"), "gen_ai.request.model": model,
             "gen_ai.request.max_tokens": kwargs.get("max_tokens"),
             "gen_ai.request.temperature": kwargs.get("temperature")}
    with tracer.start_as_current_span(f"chat {model}", context=parent, kind=SpanKind.CLIENT,
                                      attributes={k: v for k, v in attrs.items()
                                                  if v is not None}) as span:
        if os.environ.get(CAPTURE, "").lower() == "true":
            span.add_event("gen_ai.input.messages", {"content": repr(messages)[:8000]})
        try:
            out = await call(messages, **kwargs)
        except BaseException as exc:
            _set(span, {"error.type": type(exc).__name__,
                        "gen_ai.usage.input_tokens": getattr(exc, "prompt_tokens", None),
                        "gen_ai.usage.output_tokens": getattr(exc, "completion_tokens", None)})
            raise
        _set(span, {"gen_ai.response.model": getattr(out, "model", None) or model,
                    "gen_ai.response.finish_reasons": [str(out.finish_reason)],
                    "gen_ai.usage.input_tokens": out.prompt_tokens,
                    "gen_ai.usage.output_tokens": out.completion_tokens})
        if os.environ.get(CAPTURE, "").lower() == "true":
            span.add_event("gen_ai.output.messages", {"content": str(out.text)[:8000]})
        return out


async def traced_tool(tracer: Any, name: str, call_id: str,
                      run: Callable[[], Awaitable[tuple[Any, str | None, int]]]
                      ) -> tuple[Any, str | None, int]:
    """``await run()`` (one tool call: ``(result, error, attempts)``) inside an
    ``execute_tool {name}`` span (GenAI semantic conventions)."""
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
             "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function"}
    with tracer.start_as_current_span(f"execute_tool {name}", attributes=attrs) as span:
        out = await run()
        if out[1] is not None:
            span.set_attribute("error.type", out[1].split(":", 1)[0][:100])
        return out


def current_context() -> Any:
    """The current OpenTelemetry context (to parent spans started in other threads)."""
    from opentelemetry import context
    return context.get_current()


__all__ = ["installed_tracer", "traced_run", "traced_step", "traced_call", "traced_tool",
           "current_context",
           "outcome_attributes"]
