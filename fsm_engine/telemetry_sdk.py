"""Setting up the OpenTelemetry SDK from the standard ``OTEL_*`` variables, when asked.

:mod:`fsm_engine.telemetry` uses the OpenTelemetry API alone.  This module is what turns
traces on in a process that has no SDK of its own: the ``fsm`` commands call
:func:`configure` at start when :func:`asked` (they own their process); an application
that wants the same calls it itself, or installs its own SDK instead.  The variables
(OpenTelemetry's environment specification):

* ``OTEL_TRACES_EXPORTER`` names exporters (``console``, ``otlp``; ``none`` is off), or
* ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (``otlp``;
  ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` ``grpc`` or ``http/protobuf``, the default),

unless ``OTEL_SDK_DISABLED=true``.  Resource attributes come from ``OTEL_SERVICE_NAME`` /
``OTEL_RESOURCE_ATTRIBUTES`` as usual.  Why not ``opentelemetry-instrument``: it imports
every installed instrumentation into the process; this sets up tracing and nothing else.
"""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any

log = logging.getLogger("fsm_engine")

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def exporter_names(env: os._Environ[str] | dict[str, str] | None = None) -> list[str]:
    """The exporters the variables ask for (``[]``: none, or ``OTEL_SDK_DISABLED=true``);
    reads the environment only, imports nothing."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names and any(env.get(k) for k in _ENDPOINTS):
        names = ["otlp"]
    return [n for n in names if n != "none"]


def asked(env: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """True when the ``OTEL_*`` variables ask for traces (see the module doc)."""
    return bool(exporter_names(env))


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if name == "otlp":
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                  os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
        try:
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_TRACES_EXPORTER=otlp needs the opentelemetry-exporter-otlp package;"
                        " traces are off")
            return None
        return OTLPSpanExporter()
    log.warning("unknown OTEL_TRACES_EXPORTER %r ignored (fsm_engine knows console, otlp)", name)
    return None


def configure(env: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Install an SDK tracer provider exporting as the variables ask (batched; flushed at
    exit) as this process's global provider, and return True; False (nothing done) when
    they ask for nothing, a provider is installed already, or the SDK is missing (a
    warning: ``pip install 'fsm_engine[otel]'``)."""
    names = exporter_names(env)
    if not names:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_* asks for traces but the OpenTelemetry SDK is not installed "
                    "(pip install 'fsm_engine[otel]'); traces are off")
        return False
    if type(trace.get_tracer_provider()).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return False  # the application's own provider stays
    exporters = [e for e in map(_exporter, names) if e is not None]
    if not exporters:
        return False
    provider = TracerProvider(resource=Resource.create())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # flush what is batched when the process ends
    return True


__all__ = ["asked", "configure", "exporter_names"]
