"""The plain `tools/call` at its seam: for every request it takes, the answer is the one the SDK's own modern
transport gives with the same handler (status, headers that matter, the JSON); every request it does not
take is left to the SDK, untouched (nothing sent)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from mcp.server.lowlevel.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Message

from worker.gateway.identity.security import BODY_SCOPE_KEY
from worker.gateway.mcp.back_channel import BackChannelTransport
from worker.gateway.mcp.plain import PlainCalls

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
    "io.modelcontextprotocol/clientInfo": {"name": "plain-test", "version": "1"},
}
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": MODERN,
    "mcp-method": "tools/call",
    "mcp-name": "echo",
}
TEXT = {"type": "text", "text": "hello"}
DONE = {"resultType": "complete"}
IMAGE = {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}
# What the handler answers (or raises), by the tool's name.
ANSWERS: dict[str, Callable[[], dict[str, Any]]] = {
    "echo": lambda: {**DONE, "content": [TEXT], "isError": False, "_meta": {"toolworker/call": {"exitCode": 0}}},
    "structured": lambda: {**DONE, "content": [TEXT], "structuredContent": {"a": None, "b": [1, {"c": None}]}},
    "image": lambda: {**DONE, "content": [IMAGE, TEXT], "isError": True},
    "extra": lambda: {**DONE, "content": [TEXT], "notInTheSurface": 1, "_meta": None},
    "own_stamp": lambda: {**DONE, "content": [TEXT], "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "x"}}},
    "input": lambda: {"resultType": "input_required", "inputRequests": {"k": {"method": "elicitation/create"}}},
    "claimed": lambda: {"resultType": "io.example/custom", "anything": {"goes": True}},
    "no_result_type": lambda: {"content": [TEXT]},
    "invalid": lambda: {**DONE, "content": "not a list"},
}


async def handler(ctx: Any, params: types.CallToolRequestParams) -> dict[str, Any]:
    assert ctx.protocol_version == MODERN and ctx.request is not None and ctx.request_id is not None
    if params.name == "unknown":
        raise MCPError(code=types.INVALID_PARAMS, message="Unknown tool: unknown")
    if params.name == "broken":
        raise RuntimeError("an internal detail")
    if params.name == "capabilities":  # what the context tells of the client
        caps = ctx.session.client_params.capabilities if ctx.session.client_params else None
        return {**DONE, "content": [{"type": "text", "text": json.dumps(caps.model_dump(exclude_none=True))}]}
    return ANSWERS[params.name]()


@asynccontextmanager
async def transports() -> AsyncIterator[tuple[BackChannelTransport, PlainCalls]]:
    server: Server[Any] = Server("plain-test", version="1.0")
    server.middleware.clear()  # as the gateway runs when not tracing
    server.add_request_handler("tools/call", types.CallToolRequestParams, handler)
    transport = BackChannelTransport(
        server,
        stateless=True,
        json_response=True,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    async with transport.run():
        yield transport, PlainCalls(server, handler, transport)


def request(body: Any, **headers: str) -> tuple[dict[str, Any], bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    merged = {**HEADERS, **headers}
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(k.encode(), v.encode()) for k, v in merged.items() if v],
        "query_string": b"",
        BODY_SCOPE_KEY: raw,
    }
    return scope, raw


async def answer(app: Any, scope: dict[str, Any], raw: bytes) -> tuple[Any, list[Message]]:
    """What `app` sends for the request (and what it returned)."""
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    returned = await app(dict(scope), receive, send)
    return returned, sent


def response(sent: list[Message]) -> tuple[int, str, Any]:
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers["content-type"], json.loads(body)


def call(name: str, request_id: object = 7, **extra: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": {"x": 1}, "_meta": META, **extra}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


TAKEN = [
    *(pytest.param(call(name), {"mcp-name": name}, id=name) for name in ANSWERS),
    pytest.param(call("unknown"), {"mcp-name": "unknown"}, id="mcp-error"),
    pytest.param(call("broken"), {"mcp-name": "broken"}, id="internal-error"),
    pytest.param(call("capabilities"), {"mcp-name": "capabilities"}, id="client-capabilities"),
    pytest.param(call("echo", "an-id"), {}, id="string-id"),
    pytest.param(call("echo", arguments=None), {}, id="no-arguments"),
]


@pytest.mark.parametrize(("body", "headers"), TAKEN)
async def test_a_plain_call_is_answered_as_the_sdk_answers_it(body: dict[str, Any], headers: dict[str, str]) -> None:
    async with transports() as (transport, plain):
        scope, raw = request(body, **headers)
        taken, ours = await answer(plain, scope, raw)
        _, theirs = await answer(transport.handle_request, scope, raw)
    assert taken is True
    assert response(ours) == response(theirs)


async def test_each_client_is_answered_with_its_own_declared_capabilities() -> None:
    """Clients taking turns on one gateway (typed identities are kept by envelope): each call sees what its own
    client declared, as the SDK's answer does, the first time and again."""
    declared = [{"elicitation": {"form": {}}}, {"sampling": {}}, {}, {"elicitation": {"form": {}}, "roots": {}}]
    async with transports() as (transport, plain):
        for capabilities in [*declared, *declared]:
            meta = {**META, "io.modelcontextprotocol/clientCapabilities": capabilities}
            scope, raw = request(call("capabilities", _meta=meta), **{"mcp-name": "capabilities"})
            _, ours = await answer(plain, scope, raw)
            _, theirs = await answer(transport.handle_request, scope, raw)
            assert response(ours) == response(theirs)
            assert json.loads(response(ours)[2]["result"]["content"][0]["text"]) == capabilities


NOT_TAKEN = [
    pytest.param(call("echo"), {"mcp-protocol-version": "2025-11-25"}, id="handshake-era"),
    pytest.param(call("echo"), {"mcp-session-id": "abc"}, id="session"),
    pytest.param(call("echo"), {"mcp-name": "other"}, id="routing-header-mismatch"),
    pytest.param(call("echo"), {"mcp-method": ""}, id="routing-header-missing"),
    pytest.param(call("echo"), {"accept": "text/event-stream"}, id="no-json-accepted"),
    pytest.param(call("echo"), {"content-type": "text/plain"}, id="content-type"),
    pytest.param(call("echo"), {"mcp-param-x": "1"}, id="param-header"),
    pytest.param({**call("echo"), "extra": 1}, {}, id="extra-envelope-key"),
    pytest.param({**call("echo"), "method": "tools/list"}, {"mcp-method": "tools/list"}, id="other-method"),
    pytest.param(call("echo", True), {}, id="boolean-id"),
    pytest.param(call("echo", None), {}, id="null-id"),
    pytest.param({k: v for k, v in call("echo").items() if k != "id"}, {}, id="notification"),
    pytest.param([call("echo")], {}, id="batch"),
    pytest.param(b"{not json", {}, id="not-json"),
    pytest.param(call("echo", _meta={"io.modelcontextprotocol/protocolVersion": MODERN}), {}, id="envelope-short"),
    pytest.param(call("echo", arguments=[1]), {}, id="params-invalid"),
]


@pytest.mark.parametrize(("body", "headers"), NOT_TAKEN)
async def test_what_is_not_a_plain_call_is_left_to_the_sdk(body: Any, headers: dict[str, str]) -> None:
    async with transports() as (_, plain):
        scope, raw = request(body, **headers)
        taken, sent = await answer(plain, scope, raw)
    assert taken is False and sent == []


async def test_a_repeated_routing_header_is_left_to_the_sdk() -> None:
    """Two `Mcp-Name` lines (first and last readers would disagree): the SDK's rejection, not a plain call."""
    async with transports() as (_, plain):
        scope, raw = request(call("echo"))
        scope["headers"] = [*scope["headers"], (b"mcp-name", b"echo")]
        taken, sent = await answer(plain, scope, raw)
    assert taken is False and sent == []
