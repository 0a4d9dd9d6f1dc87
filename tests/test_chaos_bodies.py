"""Chaos: malformed request bodies on every surface of the gateway (REST /v1/*, MCP /mcp, ToolServer
/toolserver/*) get a JSON error with a 4xx, never a 5xx, and the gateway goes on serving."""

from __future__ import annotations

import json

import httpx2
import pytest

from tests.support.gateway_stack import Stack, auth

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

LONE_HIGH = b"\\ud800"
LONE_LOW = b"\\udc00"


def call_body(arguments: bytes, tool: bytes = b'"echo_get"') -> bytes:
    return b'{"tool": ' + tool + b', "arguments": ' + arguments + b"}"


# Each malformed body, with a name for the report.
MALFORMED: dict[str, bytes] = {
    "lone high surrogate in a value": call_body(b'{"item": "' + LONE_HIGH + b'"}'),
    "lone low surrogate in a key": call_body(b'{"' + LONE_LOW + b'": "x"}'),
    "reversed surrogate pair": call_body(b'{"item": "' + LONE_LOW + LONE_HIGH + b'"}'),
    "lone surrogate in the tool name": call_body(b"{}", b'"' + LONE_HIGH + b'"'),
    "invalid UTF-8": b'{"tool": "echo_get", "arguments": {"item": "\xff\xfe"}}',
    "truncated JSON": b'{"tool": "echo_get", "arguments": {"item": "x"}',
    "nested past the stack": b"[" * 100_000 + b"]" * 100_000,
    "NaN": call_body(b'{"limit": NaN}'),
    "Infinity": call_body(b'{"limit": -Infinity}'),
    "a 5000-digit integer": call_body(b'{"limit": ' + b"9" * 5000 + b"}"),
    "null": b"null",
    "an array": b"[1, 2]",
    "a string": b'"call me"',
}


def mcp_body(arguments: bytes) -> bytes:
    return (
        b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo_get", "arguments": '
        + arguments
        + b"}}"
    )


MCP_MALFORMED: dict[str, bytes] = {
    **MALFORMED,
    "lone surrogate in tools/call arguments": mcp_body(b'{"item": "' + LONE_HIGH + b'"}'),
    "lone surrogate in a method name": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/' + LONE_HIGH + b'"}',
}

TOOLSERVER_MALFORMED: dict[str, bytes] = {
    **MALFORMED,
    "lone surrogate in tool_name": b'{"tool_name": "' + LONE_HIGH + b'", "arguments": {}}',
    "lone surrogate in arguments": b'{"tool_name": "echo_get", "arguments": {"item": "' + LONE_HIGH + b'"}}',
    # XAgent passes the model's arguments as a JSON text: the surrogate appears only once that is decoded.
    "lone surrogate in arguments text": b'{"tool_name": "echo_get", "arguments": "{\\"item\\": \\"\\\\ud800\\"}"}',
}


def post(stack: Stack, path: str, body: bytes, **headers: str) -> httpx2.Response:
    sent = {"Content-Type": "application/json", **auth(), **headers}
    return httpx2.post(stack.url + path, content=body, headers=sent, timeout=60)


def assert_json_4xx(response: httpx2.Response, where: str) -> None:
    assert 400 <= response.status_code < 500, (where, response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json"), (where, response.headers)
    json.loads(response.content)  # a JSON error, whatever its shape


def assert_still_serving(stack: Stack) -> None:
    answer = post(stack, "/v1/calls", b'{"tool": "echo_get", "arguments": {"item": "after"}}')
    assert answer.status_code == 200 and answer.json()["exitCode"] == 0


@pytest.mark.parametrize("path", ["/v1/calls", "/v1/batches"])
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_rest_refuses_a_malformed_body_with_a_json_4xx(gateway_stack: Stack, path: str, name: str) -> None:
    """Every malformed body on POST /v1/calls and /v1/batches is a JSON 4xx (a batch wraps the call)."""
    body = MALFORMED[name]
    if path == "/v1/batches" and body.startswith(b'{"tool"'):
        body = b'{"calls": [' + body + b"]}"
    assert_json_4xx(post(gateway_stack, path, body), f"{path}: {name}")


def test_rest_goes_on_serving_after_malformed_bodies(gateway_stack: Stack) -> None:
    """After a round of every malformed body, a good call is answered."""
    for body in MALFORMED.values():
        post(gateway_stack, "/v1/calls", body)
    assert_still_serving(gateway_stack)


@pytest.mark.parametrize("name", sorted(MCP_MALFORMED))
def test_mcp_refuses_a_malformed_body_with_a_json_4xx(gateway_stack: Stack, name: str) -> None:
    """Every malformed body on POST /mcp is a JSON 4xx (a JSON-RPC error where the SDK writes one)."""
    accept = "application/json, text/event-stream"
    response = post(gateway_stack, "/mcp", MCP_MALFORMED[name], Accept=accept, **{"MCP-Protocol-Version": "2025-06-18"})
    assert_json_4xx(response, f"/mcp: {name}")
    assert_still_serving(gateway_stack)


@pytest.mark.parametrize("path", ["/toolserver/execute_tool", "/toolserver/retrieving_tools"])
@pytest.mark.parametrize("name", sorted(TOOLSERVER_MALFORMED))
def test_toolserver_refuses_a_malformed_body_with_a_json_4xx(gateway_stack: Stack, path: str, name: str) -> None:
    """Every malformed body on the ToolServer routes is a JSON 4xx."""
    assert_json_4xx(post(gateway_stack, path, TOOLSERVER_MALFORMED[name]), f"{path}: {name}")
