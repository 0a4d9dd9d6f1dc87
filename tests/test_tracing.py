"""Traces across the queue, with real processes: a worker and a gateway exporting OTLP/HTTP to a receiver
in this test (decoded with the official protobuf classes), a local upstream that records `traceparent`.

The producer here uses the OpenTelemetry API only, as an agent's process may: its span is a
NonRecordingSpan with known ids, and the worker's spans must hang under it."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tests.conftest import SECRET_TOKEN, start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, auth, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer, ServerThread
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis
from worker.protocol import parse_call
from worker.tracing import current_context, wanted

pytestmark = pytest.mark.integration

ARGUMENT_SECRET = "argument-value-7d1f2c"  # an argument value: it must appear in no span
CALL_HEADER_SECRET = "user-token-55e0a9"  # a per-call credential
KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER = 2, 3, 4, 5
STATUS_ERROR = 2

DEFINITIONS = """
upstreams:
  traced:
    base_url: ${env:TEST_UPSTREAM_URL}
    timeout_seconds: 5
    auth: {type: bearer, token: "${env:TEST_SECRET_TOKEN}"}
    overridable_headers: [X-User-Token]
    retry: {attempts: 3, backoff_seconds: 0.05, statuses: [503]}
tools:
  - name: flaky_get
    upstream: traced
    description: Answers 503 the first time for a key, then 200.
    input_schema:
      type: object
      properties: {key: {type: string}, q: {type: string}}
      required: [key, q]
    request: {method: GET, path: "/flaky/${key}", query: {q: "${q}"}}
  - name: status
    upstream: traced
    description: Answers with the given status.
    input_schema: {type: object, properties: {code: {type: integer}}, required: [code]}
    request: {method: GET, path: "/status/${code}"}
"""


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every span exported to it, and every raw request body."""

    spans: list[Span] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> web.Application:
        async def export(request: web.Request) -> web.Response:
            body = await request.read()
            decoded = ExportTraceServiceRequest.FromString(body)
            with self.lock:
                self.bodies.append(body)
                self.spans.extend(_spans(decoded))
            return web.Response(body=b"", content_type="application/x-protobuf")

        app = web.Application()
        app.router.add_post("/v1/traces", export)
        return app

    def trace(self, trace_id: str, *until: str, timeout_s: float = 20.0) -> list[Span]:
        """The spans of a trace, once spans of every name in `until` have come (each process exports its
        own, in its own time)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                spans = [s for s in self.spans if s.trace_id == trace_id]
            if set(until) <= {s.name for s in spans} or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def _spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                yield Span(
                    service=str(resource.get("service.name")),
                    name=s.name,
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(),
                    kind=s.kind,
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    status=s.status.code,
                )


@dataclass
class Upstream:
    """`/flaky/{key}`: 503 the first time a key comes, 200 after; the `traceparent` of every request."""

    traceparents: dict[str, list[str]] = field(default_factory=dict)

    def app(self) -> web.Application:
        async def flaky(request: web.Request) -> web.Response:
            seen = self.traceparents.setdefault(request.match_info["key"], [])
            seen.append(request.headers.get("traceparent", ""))
            if len(seen) == 1:
                return web.Response(status=503, text="try again")
            return web.json_response({"ok": True})

        async def status(request: web.Request) -> web.Response:
            return web.Response(status=int(request.match_info["code"]), text="as asked")

        app = web.Application()
        app.router.add_get("/flaky/{key}", flaky)
        app.router.add_get("/status/{code}", status)
        return app


@dataclass
class Stack:
    redis_url: str
    receiver: Receiver
    upstream: Upstream
    gateway: Gateway  # exports spans of its own
    quiet_gateway: Gateway  # tracing off: passes the caller's context on


@pytest.fixture(scope="module")
def stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("tracing")
    definitions = directory / "definitions"
    definitions.mkdir()
    (definitions / "tools.yaml").write_text(DEFINITIONS)
    redis = EmbeddedRedis(directory / "redis").start()
    receiver, upstream = Receiver(), Upstream()
    collector = ServerThread(receiver.app()).start()
    upstream_server = ServerThread(upstream.app()).start()
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    env = worker_env(redis.url, upstream_server.url, dns_server.address, definitions) | otel
    worker = start_worker(env, directory / "worker.log")
    gateways: list[Gateway] = []
    try:
        gateways.append(start_gateway(gateway_env(redis.url, definitions, **otel), directory / "gateway.log"))
        gateways.append(start_gateway(gateway_env(redis.url, definitions), directory / "quiet-gateway.log"))
        for gateway in gateways:
            wait_listening(gateway, ready=True)
        yield Stack(redis.url, receiver, upstream, *gateways)
    finally:
        for gateway in gateways:
            gateway.stop()
        stop_worker(worker)
        upstream_server.stop()
        collector.stop()
        redis.stop()


def producer_span() -> tuple[str, str, NonRecordingSpan]:
    """An agent's span, as the OpenTelemetry API alone makes it: (trace id, span id, span)."""
    trace_id, span_id = secrets.randbits(128), secrets.randbits(64)
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return f"{trace_id:032x}", f"{span_id:016x}", NonRecordingSpan(context)


def by_name(spans: list[Span]) -> dict[str, list[Span]]:
    named: dict[str, list[Span]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        named.setdefault(span.name, []).append(span)
    return named


def check_worker_spans(stack: Stack, spans: list[Span], parent_id: str, key: str) -> None:
    """queue wait, two attempts (503, then 200) and publication under the call's span, itself a child of
    `parent_id`; the upstream saw each attempt's span as its parent."""
    named = by_name(spans)
    (call,) = named["execute_tool flaky_get"]
    assert (call.service, call.kind, call.parent_id) == ("toolworker", KIND_CONSUMER, parent_id)
    assert call.attributes["gen_ai.tool.name"] == "flaky_get"
    assert call.attributes["toolworker.exit_code"] == 0
    assert call.attributes["toolworker.attempts"] == 2
    assert call.attributes["http.response.status_code"] == 200
    assert call.attributes["toolworker.upstream"] == "traced"
    assert call.attributes["toolworker.tenant"] == "default"
    assert call.status != STATUS_ERROR
    (queued,) = named["queue wait"]
    assert queued.parent_id == call.span_id
    assert call.start_ns == queued.start_ns <= queued.end_ns <= call.end_ns
    first, second = named["GET"]
    assert {first.parent_id, second.parent_id} == {call.span_id}
    assert first.kind == second.kind == KIND_CLIENT
    assert (first.attributes["http.response.status_code"], first.status) == (503, STATUS_ERROR)
    assert second.attributes["http.response.status_code"] == 200 and second.status != STATUS_ERROR
    assert "http.request.resend_count" not in first.attributes
    assert second.attributes["http.request.resend_count"] == 1
    assert first.attributes["server.address"] == "127.0.0.1"
    assert queued.end_ns <= first.start_ns < first.end_ns <= second.start_ns
    (publish,) = named["publish flaky_get"]
    assert (publish.parent_id, publish.kind) == (call.span_id, KIND_PRODUCER)
    assert second.end_ns <= publish.start_ns
    trace_id = call.trace_id
    sent = [f"00-{trace_id}-{first.span_id}-01", f"00-{trace_id}-{second.span_id}-01"]
    assert stack.upstream.traceparents[key] == sent


def check_nothing_secret(stack: Stack) -> None:
    with stack.receiver.lock:
        bodies = b"".join(stack.receiver.bodies)
        values = [str(v) for s in stack.receiver.spans for v in s.attributes.values()]
    for secret in (ARGUMENT_SECRET, CALL_HEADER_SECRET, SECRET_TOKEN):
        assert secret.encode() not in bodies
        assert not any(secret in value for value in values)


def test_a_trace_runs_from_the_producer_through_the_queue_to_the_upstream(stack: Stack) -> None:
    trace_id, parent_id, span = producer_span()
    key = f"client-{parent_id}"
    with ToolClient(stack.redis_url) as client, trace.use_span(span):
        result = client.call(
            "flaky_get", {"key": key, "q": ARGUMENT_SECRET}, headers={"X-User-Token": CALL_HEADER_SECRET}
        )
    assert (result.exit_code, result.status_code, result.attempts) == (0, 200, 2), result.to_dict()
    spans = stack.receiver.trace(trace_id, "execute_tool flaky_get")
    check_worker_spans(stack, spans, parent_id, key)
    assert {s.service for s in spans} == {"toolworker"}
    check_nothing_secret(stack)


def test_a_failed_call_is_an_error_span_and_a_call_without_context_is_a_trace_of_its_own(stack: Stack) -> None:
    with ToolClient(stack.redis_url) as client:
        result = client.call("status", {"code": 404})
    assert result.exit_code != 0
    deadline = time.monotonic() + 20
    while True:
        with stack.receiver.lock:
            found = [s for s in stack.receiver.spans if s.attributes.get("gen_ai.tool.call.id") == result.call_id]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (call,) = found
    assert call.parent_id == ""  # a root: nothing upstream of the worker traced it
    assert call.status == STATUS_ERROR
    assert call.attributes["toolworker.exit_code"] == result.exit_code
    assert call.attributes["error.type"] == (result.error or {})["type"]
    assert call.attributes["http.response.status_code"] == 404
    names = {s.name for s in stack.receiver.trace(call.trace_id, "execute_tool status")}
    assert names == {"execute_tool status", "queue wait", "GET", "publish status"}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_mcp_meta_traceparent_joins_the_gateway_and_the_worker(stack: Stack, mode: str) -> None:
    trace_id, parent_id, _ = producer_span()
    key = f"mcp-{mode}-{parent_id}"
    meta: Any = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    async with (
        httpx2.AsyncClient(headers=auth(), timeout=30) as http,
        Client(streamable_http_client(stack.gateway.url + "/mcp", http_client=http), mode=mode) as client,
    ):
        result = await client.call_tool("flaky_get", {"key": key, "q": ARGUMENT_SECRET}, meta=meta)
    assert not result.is_error, result
    spans = await asyncio.to_thread(stack.receiver.trace, trace_id, "execute_tool flaky_get", "tools/call flaky_get")
    named = by_name(spans)
    (server,) = named["tools/call flaky_get"]
    assert (server.service, server.kind, server.parent_id) == ("toolworker-gateway", KIND_SERVER, parent_id)
    (enqueue,) = named["enqueue flaky_get"]
    assert (enqueue.service, enqueue.kind, enqueue.parent_id) == ("toolworker-gateway", KIND_PRODUCER, server.span_id)
    check_worker_spans(stack, spans, enqueue.span_id, key)
    check_nothing_secret(stack)


async def test_gateway_without_tracing_passes_the_callers_context_on(stack: Stack) -> None:
    """Over MCP `_meta` and over the HTTP `traceparent` header (REST): the worker's span is the caller's child."""
    for front in ("mcp", "rest"):
        trace_id, parent_id, _ = producer_span()
        traceparent = f"00-{trace_id}-{parent_id}-01"
        key = f"quiet-{front}-{parent_id}"
        arguments = {"key": key, "q": ARGUMENT_SECRET}
        async with httpx2.AsyncClient(headers=auth(), timeout=30) as http:
            if front == "mcp":
                transport = streamable_http_client(stack.quiet_gateway.url + "/mcp", http_client=http)
                async with Client(transport, mode="legacy") as client:
                    meta: Any = {"traceparent": traceparent}
                    assert not (await client.call_tool("flaky_get", arguments, meta=meta)).is_error
            else:
                body = {"tool": "flaky_get", "arguments": arguments}
                answer = await http.post(
                    stack.quiet_gateway.url + "/v1/calls", json=body, headers={"traceparent": traceparent}
                )
                assert answer.json()["exitCode"] == 0, answer.text
        spans = await asyncio.to_thread(stack.receiver.trace, trace_id, "execute_tool flaky_get")
        assert {s.service for s in spans} == {"toolworker"}, front
        check_worker_spans(stack, spans, parent_id, key)


def test_the_rest_front_takes_the_traceparent_header(stack: Stack) -> None:
    trace_id, parent_id, _ = producer_span()
    key = f"rest-{parent_id}"
    body = {"tool": "flaky_get", "arguments": {"key": key, "q": ARGUMENT_SECRET}}
    headers = {**auth(), "traceparent": f"00-{trace_id}-{parent_id}-01"}
    answer = httpx2.post(stack.gateway.url + "/v1/calls", json=body, headers=headers, timeout=30)
    assert answer.json()["exitCode"] == 0, answer.text
    named = by_name(stack.receiver.trace(trace_id, "execute_tool flaky_get", "enqueue flaky_get"))
    (enqueue,) = named["enqueue flaky_get"]
    assert (enqueue.service, enqueue.parent_id) == ("toolworker-gateway", parent_id)
    check_worker_spans(stack, [s for v in named.values() for s in v], enqueue.span_id, key)


def test_tracing_is_off_without_otel_variables() -> None:
    """`wanted` reads the standard variables; nothing else switches tracing on."""
    assert not wanted({})
    assert not wanted({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"})


def test_trace_fields_that_do_not_parse_are_dropped_and_the_call_still_runs() -> None:
    message = {"tool": "status", "traceparent": 5, "tracestate": "k=v," * 200, "enqueuedAt": "yesterday"}
    call = parse_call(message, "id-1")
    assert (call.tool, call.traceparent, call.tracestate, call.enqueued_at) == ("status", None, None, None)
    valid = parse_call({"tool": "status", "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}, "id-2")
    assert valid.traceparent is not None and valid.traceparent.endswith("-01")


def test_a_client_without_an_active_span_sends_no_trace_context() -> None:
    assert current_context() == {}
    _, span_id, span = producer_span()
    with trace.use_span(span):
        carrier = current_context()
    assert carrier["traceparent"].split("-")[2] == span_id
