"""One tool call to its envelope (admission, handlers, attempts, shaping) with a fake transport at the designed seam."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs
from structlog.typing import Processor
from yarl import URL

from worker import errors, logs
from worker.call import shaping
from worker.call.admission import Turn
from worker.call.fairness import FairTurns
from worker.call.handlers import origin_of
from worker.call.job import Answer, Job
from worker.call.run import run_call
from worker.call.runtime import TURNS_PER_CONNECTION, Runtime
from worker.constants import MAX_ARGUMENTS_BYTES, MAX_ARGUMENTS_DEPTH, REDACTED
from worker.definitions.file_store import load
from worker.definitions.model import ToolSet
from worker.definitions.model import Upstream as UpstreamDef
from worker.definitions.templates import Template
from worker.envelope import ToolResult
from worker.http.transport import Limits, PoolSpec, PreparedRequest, RedirectCheck, Response
from worker.protocol import ToolCall, parse_call

ENV_SECRET = "env-secret-token-31337"
CALL_SECRET = "call-header-secret-4242"
ENVIRON = {"API_TOKEN": ENV_SECRET}

DEFINITIONS = """\
upstreams:
  api:
    base_url: https://api.example.com
    headers:
      Authorization: Bearer ${env:API_TOKEN}
    overridable_headers: [X-User-Token]
    retry: {attempts: 3, backoff_seconds: 0, statuses: [502, 503, 504]}
    max_output_chars: 50
  optin:
    base_url: https://optin.example.com
    retry: {attempts: 3, backoff_seconds: 0, unsafe_methods: true}
tools:
  - name: ticket_lookup
    upstream: api
    input_schema:
      type: object
      properties:
        ticket_id: {type: string}
      required: [ticket_id]
    request:
      method: GET
      path: /tickets/${ticket_id}
  - name: ticket_create
    upstream: api
    input_schema:
      type: object
      properties:
        title: {type: string}
      required: [title]
    request:
      method: POST
      path: /tickets
      body: {title: "${title}"}
  - name: ticket_create_optin
    upstream: optin
    input_schema:
      type: object
      properties:
        title: {type: string}
    request:
      method: POST
      path: /tickets
  - name: ticket_status
    upstream: api
    input_schema:
      type: object
      properties:
        ticket_id: {type: string}
    request:
      path: /tickets/${ticket_id}
    response:
      transform: {jmespath: "{status: status}"}
      max_output_chars: 20
  - name: broken
    upstream: nowhere
"""

Outcome = Response | BaseException


class FakeTransport:
    """Answers each attempt with the next outcome (the last one repeats) and records the requests."""

    def __init__(self, *outcomes: Outcome | Callable[[PreparedRequest], Any]) -> None:
        self.outcomes = list(outcomes) or [response()]
        self.requests: list[PreparedRequest] = []

    async def send(
        self,
        request: PreparedRequest,
        pool: PoolSpec,
        limits: Limits,
        check_redirect: RedirectCheck,
        trusted_origin: URL | None,
    ) -> Response:
        self.requests.append(request)
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if callable(outcome) and not isinstance(outcome, BaseException):
            outcome = outcome(request)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def close(self) -> None:
        pass


def response(
    status: int = 200,
    body: bytes = b'{"status": "open", "priority": "high"}',
    *,
    content_type: str | None = "application/json",
    charset: str | None = None,
    complete: bool = True,
    reason: str = "",
) -> Response:
    return Response(
        status=status,
        reason=reason or {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, ""),
        content_type=content_type,
        charset=charset,
        body=body,
        complete=complete,
        url="https://api.example.com/",
    )


def echo_headers(request: PreparedRequest) -> Response:
    """An upstream that echoes the request headers back in its body."""
    return response(body=json.dumps(dict(request.headers)).encode())


@pytest.fixture
def toolset(tmp_path: Path) -> ToolSet:
    path = tmp_path / "tools.yaml"
    path.write_text(DEFINITIONS, encoding="utf-8")
    loaded = load([path], environ={})
    assert [p.message for p in loaded.problems] == ["tool 'broken': unknown upstream 'nowhere'"]
    return loaded


@pytest.fixture
def run(toolset: ToolSet) -> Callable[..., Any]:
    """Execute a call message against a fake transport; returns (envelope, transport)."""

    async def go(message: dict[str, Any], *outcomes: Any) -> tuple[ToolResult, FakeTransport]:
        transport = FakeTransport(*outcomes)
        runtime = Runtime(toolset, ENVIRON, transport=transport)  # type: ignore[arg-type]
        envelope = await run_call(parse_call(message, "task-1"), runtime)
        return envelope, transport

    return go


def lookup(ticket_id: Any = "TICKET-123", **extra: Any) -> dict[str, Any]:
    return {"callId": "call-1", "tool": "ticket_lookup", "arguments": {"ticket_id": ticket_id}, **extra}


# --- envelopes ---------------------------------------------------------------------------------


async def test_2xx_envelope(run: Any) -> None:
    """A 2xx answer is exit 0 with the request described (secrets redacted) and the body as result."""
    envelope, transport = await run(lookup())
    assert len(transport.requests) == 1
    data = envelope.to_dict()
    assert data["callId"] == "call-1" and data["tool"] == "ticket_lookup"
    assert data["method"] == "GET"
    assert data["url"] == "https://api.example.com/tickets/TICKET-123"
    assert data["headers"]["Authorization"] == REDACTED
    assert data["body"] is None
    assert data["statusCode"] == 200 and data["contentType"] == "application/json"
    assert json.loads(data["result"]) == {"status": "open", "priority": "high"}
    assert data["error"] is None and data["exitCode"] == 0 and data["truncated"] is False
    assert data["attempts"] == 1 and data["durationMs"] >= 0
    assert ENV_SECRET not in json.dumps(data)


async def test_post_envelope_shows_the_body(run: Any) -> None:
    """The envelope of a POST shows the JSON body that was sent."""
    envelope, transport = await run({"tool": "ticket_create", "arguments": {"title": "Printer on fire"}})
    assert envelope.exit_code == 0 and envelope.method == "POST"
    assert envelope.body is not None and json.loads(envelope.body) == {"title": "Printer on fire"}
    assert transport.requests[0].body == envelope.body.encode()


async def test_non_2xx_is_exit_22_with_body_kept(run: Any) -> None:
    """A non-2xx answer is exit 22, status and body kept, and the message tells the model it failed."""
    envelope, _ = await run(lookup(), response(404, b'{"detail": "no such ticket"}'))
    assert envelope.exit_code == 22
    assert envelope.status_code == 404
    assert json.loads(envelope.result) == {"detail": "no such ticket"}
    assert envelope.error is not None
    assert "404" in envelope.error["message"] and "fail" in envelope.error["message"].lower()


async def test_non_2xx_body_is_not_transformed(run: Any) -> None:
    """A non-2xx body is kept as sent, not passed through the tool's transform."""
    envelope, _ = await run(
        {"tool": "ticket_status", "arguments": {"ticket_id": "T-1"}}, response(404, b'{"detail": "gone"}')
    )
    assert envelope.exit_code == 22
    assert json.loads(envelope.result) == {"detail": "gone"}


async def test_missing_argument_is_exit_65_with_a_usable_message(run: Any) -> None:
    """A missing required argument is exit 65 naming it, and nothing is sent."""
    envelope, transport = await run({"tool": "ticket_lookup", "arguments": {}})
    assert envelope.exit_code == 65
    assert envelope.error is not None and envelope.error["type"] == "invalid_arguments"
    assert "`ticket_id` is required" in envelope.error["message"]
    assert transport.requests == []


async def test_wrong_argument_type_is_exit_65(run: Any) -> None:
    """An argument of the wrong type is exit 65 naming the argument and the expected type."""
    envelope, transport = await run(lookup(ticket_id=123))
    assert envelope.exit_code == 65
    assert envelope.error is not None
    assert "ticket_id" in envelope.error["message"] and "string" in envelope.error["message"]
    assert transport.requests == []


async def test_unknown_tool_is_exit_64(run: Any) -> None:
    """A tool name the store does not know is exit 64, and nothing is sent."""
    envelope, transport = await run({"tool": "no_such_tool"})
    assert envelope.exit_code == 64
    assert envelope.error is not None and "no_such_tool" in envelope.error["message"]
    assert transport.requests == []


async def test_broken_tool_is_exit_78(run: Any) -> None:
    """A tool whose definition is broken is exit 78, and nothing is sent."""
    envelope, transport = await run({"tool": "broken"})
    assert envelope.exit_code == 78
    assert transport.requests == []


async def test_passed_deadline_is_exit_75_and_not_sent(run: Any) -> None:
    """A call whose deadline has passed is exit 75 and the transport is never called."""
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    envelope, transport = await run(lookup(deadline=past))
    assert envelope.exit_code == 75
    assert transport.requests == []


async def test_future_deadline_is_sent(run: Any) -> None:
    """A call whose deadline is still ahead is sent."""
    future = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    envelope, transport = await run(lookup(deadline=future))
    assert envelope.exit_code == 0 and len(transport.requests) == 1


async def test_arguments_over_1_mib_are_exit_65(run: Any) -> None:
    """Arguments larger than 1 MiB serialized are exit 65, and nothing is sent."""
    envelope, transport = await run(lookup(ticket_id="x" * (MAX_ARGUMENTS_BYTES + 1)))
    assert envelope.exit_code == 65
    assert transport.requests == []


async def test_call_timeout_is_exit_28(run: Any) -> None:
    """An upstream that does not answer within the call's timeoutSeconds is exit 28."""
    never = asyncio.Event()

    async def hang(request: PreparedRequest) -> Response:
        await never.wait()
        raise AssertionError("unreachable: the event is never set")

    envelope, transport = await run(lookup(timeoutSeconds=0.05), hang)
    assert envelope.exit_code == 28
    assert envelope.error is not None and envelope.error["type"] == "timeout"
    assert transport.requests


def narrow(toolset: ToolSet, max_concurrency: int) -> ToolSet:
    """The toolset with the `api` upstream limited to max_concurrency connections."""
    api = dataclasses.replace(toolset.upstreams["api"], max_concurrency=max_concurrency)
    return dataclasses.replace(toolset, upstreams={**toolset.upstreams, "api": api})


class Gate:
    """An upstream that holds every request until opened, counting those it holds at once."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.holding = self.most = 0

    async def __call__(self, request: PreparedRequest) -> Response:
        self.holding += 1
        self.most = max(self.most, self.holding)
        try:
            await self.open.wait()
        finally:
            self.holding -= 1
        return response()


async def test_calls_to_one_upstream_take_turns(toolset: ToolSet) -> None:
    """At most TURNS_PER_CONNECTION x max_concurrency calls to an upstream are under way at once; the
    others wait their turn unprepared, and every call is answered."""
    gate = Gate()
    transport = FakeTransport(gate)
    runtime = Runtime(narrow(toolset, 2), ENVIRON, transport=transport)  # type: ignore[arg-type]
    calls = [asyncio.ensure_future(run_call(parse_call(lookup(), f"task-{i}"), runtime)) for i in range(20)]
    while gate.holding < TURNS_PER_CONNECTION * 2:
        await asyncio.sleep(0)
    for _ in range(20):  # the others would have been rendered and sent by now
        await asyncio.sleep(0)
    assert gate.holding == len(transport.requests) == TURNS_PER_CONNECTION * 2
    gate.open.set()
    assert [envelope.exit_code for envelope in await asyncio.gather(*calls)] == [0] * 20
    assert gate.most == TURNS_PER_CONNECTION * 2 and len(transport.requests) == 20


async def test_a_call_without_a_turn_in_its_time_is_exit_28_and_not_sent(toolset: ToolSet) -> None:
    """A call still waiting for its turn when its time is up ends with exit 28, unsent."""
    gate = Gate()
    transport = FakeTransport(gate)
    runtime = Runtime(narrow(toolset, 1), ENVIRON, transport=transport)  # type: ignore[arg-type]
    busy = [asyncio.ensure_future(run_call(parse_call(lookup(), f"busy-{i}"), runtime)) for i in range(2)]
    while gate.holding < 2:
        await asyncio.sleep(0)
    late = await run_call(parse_call(lookup(timeoutSeconds=0.05), "late"), runtime)
    assert late.exit_code == 28 and late.error is not None
    assert "2 calls under way" in late.error["message"]
    assert len(transport.requests) == 2
    gate.open.set()
    assert [envelope.exit_code for envelope in await asyncio.gather(*busy)] == [0, 0]


async def test_a_call_gives_its_turn_back_while_it_waits_to_retry(toolset: ToolSet) -> None:
    """Calls sleeping on a Retry-After hold no turn: another call is sent and answered meanwhile."""
    later = dataclasses.replace(response(503), retry_after="1")
    transport = FakeTransport(later, later, response(200))
    runtime = Runtime(narrow(toolset, 1), ENVIRON, transport=transport)  # type: ignore[arg-type]
    waiting = [asyncio.ensure_future(run_call(parse_call(lookup(), f"waiting-{i}"), runtime)) for i in range(2)]
    while len(transport.requests) < 2:
        await asyncio.sleep(0)
    quick = await run_call(parse_call(lookup(timeoutSeconds=0.5), "quick"), runtime)
    assert quick.exit_code == 0 and len(transport.requests) == 3
    assert [(e.exit_code, e.attempts) for e in await asyncio.gather(*waiting)] == [(0, 2), (0, 2)]


# --- retries -----------------------------------------------------------------------------------


async def test_idempotent_get_retried_on_503(run: Any) -> None:
    """A GET answered 503 is retried, and `attempts` counts every attempt."""
    envelope, transport = await run(lookup(), response(503), response(503), response(200))
    assert envelope.exit_code == 0 and envelope.status_code == 200
    assert envelope.attempts == 3 and len(transport.requests) == 3


async def test_retries_stop_at_attempts(run: Any) -> None:
    """After `attempts` tries the last answer is the result, and `attempts` says so."""
    envelope, transport = await run(lookup(), response(503, b"busy"))
    assert envelope.exit_code == 22 and envelope.status_code == 503
    assert envelope.attempts == 3 and len(transport.requests) == 3
    assert envelope.result == "busy"


async def test_status_not_in_retry_list_is_not_retried(run: Any) -> None:
    """A status outside the retry statuses (500) is answered at once."""
    envelope, transport = await run(lookup(), response(500), response(200))
    assert envelope.exit_code == 22 and envelope.attempts == 1 and len(transport.requests) == 1


async def test_connect_error_is_retried(run: Any) -> None:
    """A connect failure on an idempotent call is retried."""
    envelope, transport = await run(lookup(), errors.ConnectFailed("no route"), response(200))
    assert envelope.exit_code == 0 and envelope.attempts == 2 and len(transport.requests) == 2


async def test_connect_error_on_every_attempt(run: Any) -> None:
    """When every attempt fails to connect, the envelope is exit 7 after `attempts` tries."""
    envelope, transport = await run(lookup(), errors.ConnectFailed("Could not connect to api.example.com."))
    assert envelope.exit_code == 7 and envelope.attempts == 3 and len(transport.requests) == 3
    assert envelope.error is not None and envelope.error["type"] == "connect_failed"


async def test_non_retryable_transport_error_is_not_retried(run: Any) -> None:
    """A TLS failure is not retried and ends as exit 35."""
    envelope, transport = await run(lookup(), errors.TLSFailed("bad certificate"), response(200))
    assert envelope.exit_code == 35 and envelope.attempts == 1 and len(transport.requests) == 1


async def test_post_not_retried_by_default(run: Any) -> None:
    """A POST answered 503 is not retried unless its upstream opts in."""
    envelope, transport = await run({"tool": "ticket_create", "arguments": {"title": "t"}}, response(503))
    assert envelope.exit_code == 22 and envelope.attempts == 1 and len(transport.requests) == 1


async def test_post_retried_when_upstream_opts_in(run: Any) -> None:
    """A POST to an upstream with `unsafe_methods` is retried on 503."""
    message = {"callId": "c-7", "tool": "ticket_create_optin", "arguments": {"title": "t"}}
    envelope, transport = await run(message, response(503), response(200))
    assert envelope.exit_code == 0 and envelope.attempts == 2 and len(transport.requests) == 2


async def test_retried_post_carries_idempotency_key(run: Any) -> None:
    """A POST retried by opt-in carries `Idempotency-Key: <callId>` on every attempt."""
    message = {"callId": "c-7", "tool": "ticket_create_optin", "arguments": {"title": "t"}}
    _, transport = await run(message, response(503), response(200))
    for request in transport.requests:
        assert ("idempotency-key", "c-7") in {(k.lower(), v) for k, v in request.headers}


async def test_transport_bug_is_exit_70_without_traceback(run: Any) -> None:
    """An unexpected exception is exit 70 with a generic message: no traceback, no exception text."""
    envelope, _ = await run(lookup(), RuntimeError(f"boom {ENV_SECRET} at line 42"))
    assert envelope.exit_code == 70
    assert envelope.error is not None and envelope.error["type"] == "internal_error"
    text = json.dumps(envelope.to_dict())
    assert "Traceback" not in text and "boom" not in text and "RuntimeError" not in text
    assert ENV_SECRET not in text


# --- secrets -----------------------------------------------------------------------------------


async def test_secrets_echoed_by_the_upstream_are_redacted(run: Any) -> None:
    """Env and call-header secrets the upstream echoes back are redacted in `result`."""
    message = lookup(headers={"X-User-Token": CALL_SECRET})
    envelope, transport = await run(message, echo_headers)
    sent = dict(transport.requests[0].headers)
    assert sent["Authorization"] == f"Bearer {ENV_SECRET}" and sent["X-User-Token"] == CALL_SECRET
    text = json.dumps(envelope.to_dict())
    assert ENV_SECRET not in text and CALL_SECRET not in text
    assert REDACTED in envelope.result
    assert envelope.headers["X-User-Token"] == REDACTED


async def test_call_logs_finished_without_secrets(run: Any) -> None:
    """A call logs `call.finished` with callId/tool/upstream/exitCode, and no secret in any event."""
    processors: list[Processor] = [
        logs.merge_call_fields,
        logs.redact_secret_keys,
        structlog.processors.format_exc_info,
        logs.redact_secret_values,
    ]
    with capture_logs(processors=processors) as events:
        ok, _ = await run(lookup(headers={"X-User-Token": CALL_SECRET, "X-Dropped": CALL_SECRET}), echo_headers)
        bug, _ = await run(lookup(headers={"X-User-Token": CALL_SECRET}), RuntimeError(f"{ENV_SECRET} {CALL_SECRET}"))
    assert ok.exit_code == 0 and bug.exit_code == 70
    finished = [e for e in events if e["event"] == "call.finished"]
    assert len(finished) == 2
    for event, code in zip(finished, [0, 70], strict=True):
        assert event["callId"] == "call-1" and event["tool"] == "ticket_lookup"
        assert event["upstream"] == "api" and event["exitCode"] == code
    for event in events:
        text = repr(event)
        assert ENV_SECRET not in text and CALL_SECRET not in text, event


async def test_call_logs_its_tenant(run: Any) -> None:
    """Every log line of a call names its tenant (default when the call names none)."""
    with capture_logs(processors=[logs.merge_call_fields]) as events:
        await run(lookup(tenant="acme"), echo_headers)
        await run(lookup(), echo_headers)
    finished = [e for e in events if e["event"] == "call.finished"]
    assert [e["tenant"] for e in finished] == ["acme", "default"]


def test_log_keys_that_name_a_secret_are_redacted_at_any_depth() -> None:
    """Keys naming a secret are redacted in nested mappings too, the same on every line; other keys
    (an integer one too) keep their values."""
    for _ in range(2):
        event = {"event": "x", "callId": "c", "apiKey": "s1", "nested": {"Authorization": "s2", 3: "t", "ok": "v"}}
        assert logs.redact_secret_keys(None, "", event) == {
            "event": "x",
            "callId": "c",
            "apiKey": REDACTED,
            "nested": {"Authorization": REDACTED, 3: "t", "ok": "v"},
        }


# --- shaping the envelope -----------------------------------------------------------------------


def shaped(
    toolset: ToolSet, resp: Response, tool: str = "ticket_lookup", secrets: frozenset[str] = frozenset()
) -> ToolResult:
    definition = toolset.tools[tool]
    job = Job(ToolCall(callId="c", tool=tool), definition, toolset.upstreams[definition.upstream], {}, 0.0)
    request = PreparedRequest("GET", "http://upstream.test/x", (), None, secrets, frozenset())
    return shaping.envelope(job, Answer(request, resp, attempts=1))


def test_result_cut_to_max_output_chars(toolset: ToolSet) -> None:
    """A result longer than max_output_chars is cut to it and marked truncated."""
    envelope = shaped(toolset, response(body=b"a" * 120, content_type="text/plain"))
    assert envelope.result == "a" * 50 and envelope.truncated is True


def test_result_at_the_limit_is_not_truncated(toolset: ToolSet) -> None:
    """A result of exactly max_output_chars is whole."""
    envelope = shaped(toolset, response(body=b"a" * 50, content_type="text/plain"))
    assert envelope.result == "a" * 50 and envelope.truncated is False


def test_limit_counts_characters_not_bytes(toolset: ToolSet) -> None:
    """max_output_chars counts decoded characters."""
    envelope = shaped(toolset, response(body=("é" * 50).encode(), content_type="text/plain"))
    assert envelope.result == "é" * 50 and envelope.truncated is False


def test_tool_max_output_chars_wins(toolset: ToolSet) -> None:
    """The tool's own max_output_chars overrides the upstream's."""
    envelope = shaped(toolset, response(body=json.dumps({"status": "x" * 100}).encode()), tool="ticket_status")
    assert len(envelope.result) <= 20 and envelope.truncated is True
    assert json.loads(envelope.result)["status"].startswith("xxxx")  # a JSON body is cut as JSON


def test_incomplete_body_is_truncated(toolset: ToolSet) -> None:
    """A body cut at max_response_bytes is marked truncated even when short."""
    envelope = shaped(toolset, response(body=b"partial", content_type="text/plain", complete=False))
    assert envelope.result == "partial" and envelope.truncated is True
    assert envelope.exit_code == 0


def test_transform_applied(toolset: ToolSet) -> None:
    """The tool's transform shapes a 2xx JSON body."""
    envelope = shaped(toolset, response(body=b'{"status": "open", "noise": [1, 2]}'), tool="ticket_status")
    assert json.loads(envelope.result) == {"status": "open"}


def test_transform_on_incomplete_body_is_exit_63(toolset: ToolSet) -> None:
    """A transform needs the whole body: an incomplete one is ResponseTooLarge (exit 63), and the envelope
    still describes the request that was sent."""
    envelope = shaped(toolset, response(body=b'{"status": "op', complete=False), tool="ticket_status")
    assert envelope.exit_code == errors.ResponseTooLarge.exit_code == 63
    assert envelope.error is not None and envelope.error["type"] == errors.ResponseTooLarge.type
    assert envelope.url == "http://upstream.test/x" and envelope.attempts == 1


async def test_transform_on_incomplete_body_envelope(run: Any) -> None:
    """Through execute, a transform on an incomplete body ends as exit 63."""
    envelope, _ = await run(
        {"tool": "ticket_status", "arguments": {"ticket_id": "T-1"}}, response(body=b'{"a', complete=False)
    )
    assert envelope.exit_code == 63 and envelope.error is not None


@pytest.mark.parametrize(
    ("body", "charset", "expected"),
    [
        ("café crème".encode("latin-1"), "iso-8859-1", "café crème"),
        ("café crème".encode("latin-1"), "latin-1", "café crème"),
        ("naïve".encode("cp1252"), "windows-1252", "naïve"),
        ("café".encode(), None, "café"),
        ("café".encode(), "x-no-such-charset", "café"),
        (b"ok \xff\xfe", "x-no-such-charset", "ok \ufffd\ufffd"),
        (b"ok \xff", None, "ok \ufffd"),
    ],
)
def test_result_decoded_by_charset(toolset: ToolSet, body: bytes, charset: str | None, expected: str) -> None:
    """The body is decoded by its charset; an unknown or absent charset means UTF-8 with replacement."""
    envelope = shaped(toolset, response(body=body, content_type="text/plain", charset=charset))
    assert envelope.result == expected


def test_secret_in_result_is_redacted(toolset: ToolSet) -> None:
    """A secret echoed in the body is replaced by `[redacted]`."""
    envelope = shaped(toolset, response(body=f"token={ENV_SECRET}".encode()), secrets=frozenset({ENV_SECRET}))
    assert envelope.result == f"token={REDACTED}"


def test_secret_cut_by_truncation_does_not_leak(toolset: ToolSet) -> None:
    """A secret straddling the output limit leaks no prefix: redaction happens before the cut."""
    body = ("a" * 45 + ENV_SECRET).encode()
    envelope = shaped(toolset, response(body=body, content_type="text/plain"), secrets=frozenset({ENV_SECRET}))
    assert envelope.result.startswith("a" * 45)
    assert ENV_SECRET[:5] not in envelope.result
    assert envelope.truncated is True


# --- parse_call --------------------------------------------------------------------------------


@pytest.mark.parametrize("message", [None, [], ["ticket_lookup"], "ticket_lookup", 42])
def test_parse_call_refuses_non_objects(message: Any) -> None:
    """A message that is not a JSON object is an argument error."""
    with pytest.raises(errors.InvalidArguments):
        parse_call(message, "task-1")


@pytest.mark.parametrize(
    "message",
    [
        {},
        {"arguments": {}},
        {"tool": ""},
        {"tool": 5},
        {"tool": "t", "arguments": [1, 2]},
        {"tool": "t", "arguments": "ticket_id=1"},
        {"tool": "t", "headers": {"X-A": 1}},
        {"tool": "t", "headers": ["X-A: 1"]},
        {"tool": "t", "timeoutSeconds": -1},
        {"tool": "t", "timeoutSeconds": "soon"},
        {"tool": "t", "deadline": "tomorrow"},
        {"tool": "t", "callId": ""},
    ],
)
def test_parse_call_refuses_bad_fields(message: dict[str, Any]) -> None:
    """A missing tool or a field of the wrong type is an argument error (exit 65)."""
    with pytest.raises(errors.InvalidArguments) as info:
        parse_call(message, "task-1")
    assert info.value.exit_code == 65


def test_parse_call_names_the_missing_tool_field() -> None:
    """The message for a missing `tool` names the field."""
    with pytest.raises(errors.InvalidArguments, match="tool"):
        parse_call({"arguments": {}}, "task-1")


def test_parse_call_defaults_call_id_to_task_id() -> None:
    """Only `tool` is required; callId defaults to the task id."""
    call = parse_call({"tool": "ticket_lookup"}, "task-9")
    assert call.call_id == "task-9" and call.tool == "ticket_lookup"
    assert call.arguments == {} and call.headers == {}
    assert call.deadline is None and call.timeout_s is None and call.reply_to is None


def test_parse_call_reads_every_field() -> None:
    """Every field of the job is read from its camelCase name."""
    call = parse_call(
        {
            "callId": "c-1",
            "tool": "ticket_lookup",
            "arguments": {"ticket_id": "T"},
            "headers": {"X-User-Token": "u"},
            "sessionId": "s-42",
            "timeoutSeconds": 5,
            "deadline": "2026-11-22T10:00:00Z",
            "replyTo": "agent:42:results",
        },
        "task-1",
    )
    assert isinstance(call, ToolCall)
    assert (call.call_id, call.session_id, call.timeout_s, call.reply_to) == ("c-1", "s-42", 5, "agent:42:results")
    assert call.headers == {"X-User-Token": "u"} and call.arguments == {"ticket_id": "T"}
    assert call.deadline == datetime(2026, 11, 22, 10, tzinfo=UTC)


async def test_retry_after_is_honoured(run: Any) -> None:
    """A 503 with Retry-After is retried after the time the upstream asked for."""
    started = time.monotonic()
    busy = dataclasses.replace(response(503, b"busy"), retry_after="0.3")
    envelope, transport = await run(lookup(), busy, response(200))
    assert envelope.exit_code == 0 and envelope.attempts == 2 and len(transport.requests) == 2
    assert time.monotonic() - started >= 0.3


async def test_retry_after_beyond_the_deadline_is_not_waited_for(run: Any) -> None:
    """When Retry-After asks for more time than the call has, the 503 answer stands at once."""
    started = time.monotonic()
    busy = dataclasses.replace(response(503, b"come back later"), retry_after="30")
    envelope, transport = await run(lookup(timeoutSeconds=5), busy, response(200))
    assert len(transport.requests) == 1
    assert envelope.exit_code == 22 and envelope.status_code == 503 and envelope.attempts == 1
    assert envelope.result == "come back later"
    assert time.monotonic() - started < 2


async def test_circuit_opens_and_its_state_is_exported(toolset: ToolSet) -> None:
    """Consecutive transport failures open the upstream's circuit: calls fail fast (69), the gauge reads open."""
    from prometheus_client import REGISTRY

    transport = FakeTransport(errors.ConnectFailed("no route"))
    runtime = Runtime(toolset, ENVIRON, transport=transport)  # type: ignore[arg-type]
    for _ in range(2):  # 3 attempts each: 6 consecutive failures, past the default threshold of 5
        assert (await run_call(parse_call(lookup(), "task-1"), runtime)).exit_code == 7
    sent = len(transport.requests)
    transport.outcomes = [response(200)]
    refused = await run_call(parse_call(lookup(), "task-2"), runtime)
    assert refused.exit_code == 69 and len(transport.requests) == sent
    assert refused.error is not None and "retrying in" in refused.error["message"]
    upstream = toolset.tools["ticket_lookup"].upstream
    assert REGISTRY.get_sample_value("toolworker_circuit_state", {"upstream": upstream}) == 2


async def test_a_turn_wait_past_the_deadline_reports_no_negative_time() -> None:
    """A call whose deadline passed while it waited to queue for its turn says it waited 0 seconds, not less."""
    turns = FairTurns(1, lambda tenant: 1)
    await turns.acquire("default")
    upstream = UpstreamDef("busy", Template.literal("http://127.0.0.1:9"))
    turn = Turn(turns, upstream, deadline=time.time() - 5, tenant="default")
    with pytest.raises(errors.TimedOut) as raised:
        await turn.take()
    assert "waited 0 seconds" in raised.value.message


def nested_object(depth: int) -> dict[str, Any]:
    """`depth` levels of objects, the outermost included."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"inner": value}
    return value


@pytest.mark.parametrize("depth", [MAX_ARGUMENTS_DEPTH + 1, 600, 100_000])
async def test_arguments_nested_too_deep_are_exit_65(run: Any, depth: int) -> None:
    """Arguments nested past MAX_ARGUMENTS_DEPTH are exit 65 saying so, whatever the depth (no
    RecursionError, no 70), and nothing is sent."""
    arguments = {"ticket_id": "T-1", **nested_object(depth)}  # `depth` levels in all
    envelope, transport = await run({"tool": "ticket_lookup", "arguments": arguments})
    assert envelope.exit_code == 65 and envelope.error is not None
    assert f"more than {MAX_ARGUMENTS_DEPTH} levels deep" in envelope.error["message"]
    assert transport.requests == []


async def test_arguments_nested_to_the_limit_are_not_refused_for_their_depth(run: Any) -> None:
    """Exactly MAX_ARGUMENTS_DEPTH levels is allowed (the schema then has its say)."""
    arguments = {"ticket_id": "T-1", **nested_object(MAX_ARGUMENTS_DEPTH)}
    envelope, _ = await run({"tool": "ticket_lookup", "arguments": arguments})
    assert envelope.error is None or "levels deep" not in envelope.error["message"]


_URL_TEXT = st.text(alphabet=st.sampled_from(list("abcH:/?#@[]\\%.19")), max_size=20)


@given(st.sampled_from(["http://", "https://", "HTTP://"]), _URL_TEXT, _URL_TEXT)
def test_a_request_s_origin_is_the_origin_yarl_parses(scheme: str, authority: str, rest: str) -> None:
    """The trusted origin is read from the text before the path, as parsing the whole URL would read it."""
    url = scheme + authority + rest
    try:
        expected: Any = URL(url, encoded=True).origin()
    except ValueError:
        expected = ValueError
    try:
        found: Any = origin_of(url)
    except ValueError:
        found = ValueError
    assert found == expected
