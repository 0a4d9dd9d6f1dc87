"""OpenTelemetry traces of tool calls, from the agent's span across the queue to the upstream.

A producer's W3C trace context travels in the call object (`traceparent`, `tracestate`; `enqueuedAt`
dates the message). The worker continues that trace:

    <the producer's span>
      └─ execute_tool <tool>    (consumer)   from enqueuedAt: tool, upstream, exit code, status code, attempts
           ├─ queue wait                     enqueuedAt → taken off the queue
           ├─ GET               (client)     one per attempt, `traceparent` sent to the upstream
           ├─ GET               (client)     a retry: http.request.resend_count 1
           └─ publish <tool>    (producer)   the envelope stored and announced

Spans carry names, codes and counts, never argument values, URLs or headers (they may hold secrets).
Export is OTLP over HTTP, configured by the standard variables (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT,
OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER[_ARG], OTEL_BSP_*, ...). With no endpoint set, or with
OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none, tracing is off: the SDK is never imported and each
hook below costs one check. Producers need only the API: `current_context()` reads the active span.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from yarl import URL

from worker import errors
from worker.constants import DEFAULT_TENANT

log = structlog.get_logger("toolworker.tracing")

TRACE_FIELDS = ("traceparent", "tracestate")
MAX_TRACEPARENT_CHARS = 55  # version 00: 2 + 1 + 32 + 1 + 16 + 1 + 2
MAX_TRACESTATE_CHARS = 512  # W3C: a longer tracestate may be dropped
TENANT_ATTRIBUTE = "toolworker.tenant"  # on the call's span: who it was for (a tenant's name is no secret)
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

_W3C = TraceContextTextMapPropagator()
_OFF: AbstractContextManager[None] = nullcontext()
_tracer: Tracer | None = None  # None: tracing is off in this process
_configured_pid: int | None = None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return exporter == "otlp" or any(environ.get(name, "").strip() for name in _ENDPOINTS)


def configure(default_service: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Start exporting this process's spans when the OTEL_* variables ask for it; True if tracing is on.
    Once per process (a forked child configures its own)."""
    global _tracer, _configured_pid
    if _configured_pid == os.getpid():
        return _tracer is not None
    _configured_pid = os.getpid()
    if not wanted(environ):
        _tracer = None
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol not in (None, "", "http/protobuf"):
        log.warning("tracing.protocol_unsupported", protocol=protocol, using="http/protobuf")
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER[_ARG]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # exports what is still batched
    _tracer = provider.get_tracer("toolworker")
    log.info("tracing.on", service=resource.attributes.get(SERVICE_NAME), sampler=str(provider.sampler))
    return True


def enabled() -> bool:
    return _tracer is not None


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still batched (a worker that stops)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if _tracer is not None and force_flush is not None:
        force_flush(int(timeout_s * 1000))


# --- producers --------------------------------------------------------------------------------------


def current_context() -> dict[str, str]:
    """The active span's W3C trace context (`traceparent`, maybe `tracestate`); empty when there is none."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier


def context_from(source: Mapping[str, Any] | None) -> dict[str, str]:
    """The trace context fields of an MCP `_meta` object or HTTP headers, as they came (the worker
    ignores a malformed one, as W3C asks)."""
    if not source:
        return {}
    found = {name: source.get(name) for name in TRACE_FIELDS}
    return {name: value for name, value in found.items() if isinstance(value, str) and value}


@contextmanager
def _producing(tool: str, carrier: Mapping[str, str]) -> Iterator[None]:
    assert _tracer is not None
    parent = None if trace.get_current_span().get_span_context().is_valid else _W3C.extract(carrier)
    with _tracer.start_as_current_span(f"enqueue {tool}", context=parent, kind=SpanKind.PRODUCER):
        yield


def producing(tool: str, carrier: Mapping[str, str]) -> AbstractContextManager[None]:
    """The gateway enqueueing a call: when tracing, a producer span (a child of the request's span, or of
    `carrier`), current while the message is written, so that the message carries it."""
    return _OFF if _tracer is None else _producing(tool, carrier)


# --- the worker -------------------------------------------------------------------------------------


def serving(
    tool: str,
    call_id: str,
    carrier: Mapping[str, str | None],
    enqueued_at: datetime | None,
    received_at: float,
    tenant: str = DEFAULT_TENANT,
) -> AbstractContextManager[trace.Span | None]:
    """The span of one call (current while it runs), after its time in the queue; None when off."""
    if _tracer is None:
        return _OFF
    return _serving(_tracer, tool, call_id, carrier, enqueued_at, received_at, tenant)


@contextmanager
def _serving(
    tracer: Tracer,
    tool: str,
    call_id: str,
    carrier: Mapping[str, str | None],
    enqueued_at: datetime | None,
    received_at: float,
    tenant: str,
) -> Iterator[trace.Span]:
    parent: Context = _W3C.extract({k: v for k, v in carrier.items() if v})  # empty: a trace of its own
    taken_ns = int(received_at * 1e9)
    enqueued_ns = None if enqueued_at is None else min(int(enqueued_at.timestamp() * 1e9), taken_ns)
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        TENANT_ATTRIBUTE: tenant,
    }
    with tracer.start_as_current_span(
        f"execute_tool {tool}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        start_time=taken_ns if enqueued_ns is None else enqueued_ns,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        if enqueued_ns is not None and span.is_recording():
            tracer.start_span("queue wait", start_time=enqueued_ns).end(end_time=taken_ns)
        yield span


def answered(
    span: trace.Span | None,
    upstream: str | None,
    exit_code: int,
    status_code: int | None,
    attempts: int,
    error_type: str | None,
) -> None:
    """What the call's span tells of its envelope (never its result or error message)."""
    if span is None:
        return
    span.set_attribute("toolworker.exit_code", exit_code)
    span.set_attribute("toolworker.attempts", attempts)
    if upstream is not None:
        span.set_attribute("toolworker.upstream", upstream)
    if status_code is not None:
        span.set_attribute("http.response.status_code", status_code)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(StatusCode.ERROR, error_type)


def publishing(tool: str) -> AbstractContextManager[Any]:
    """The span of an envelope's publication."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return _OFF
    return _tracer.start_as_current_span(f"publish {tool}", kind=SpanKind.PRODUCER)


def attempting(method: str, url: str, number: int) -> AbstractContextManager[trace.Span | None]:
    """The span of one HTTP attempt (current while it runs); None when off, or when the call's trace is
    not sampled (then the call's own context goes to the upstream, flagged not sampled: a call's spans
    are made only when they will be exported, the costly part of tracing)."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return _OFF
    return _attempting(_tracer, method, url, number)


@contextmanager
def _attempting(tracer: Tracer, method: str, url: str, number: int) -> Iterator[trace.Span]:
    target = URL(url)
    attributes: dict[str, Any] = {"http.request.method": method, "server.address": target.host or ""}
    if target.port is not None:
        attributes["server.port"] = target.port
    if number > 1:
        attributes["http.request.resend_count"] = number - 1
    with tracer.start_as_current_span(
        method, kind=SpanKind.CLIENT, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except errors.ToolError as exc:
            span.set_attribute("error.type", exc.type)
            span.set_status(StatusCode.ERROR, exc.type)
            raise
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(StatusCode.ERROR, type(exc).__qualname__)
            raise


def responded(span: trace.Span | None, status: int) -> None:
    if span is None:
        return
    span.set_attribute("http.response.status_code", status)
    if status >= 400:
        span.set_attribute("error.type", str(status))
        span.set_status(StatusCode.ERROR)


def propagation(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Request headers with the current span's `traceparent` (and `tracestate`) in place of any given."""
    carrier = current_context()
    if not carrier:
        return headers
    kept = tuple((name, value) for name, value in headers if name.lower() not in TRACE_FIELDS)
    return kept + tuple(carrier.items())
