"""Arguments nested too deep (docs/guides/security.md): refused as invalid arguments (65) at every surface, with a
clear message and no traceback, through a real gateway and a real worker."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types._types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY

from tests.support.gateway_stack import Stack, auth
from worker.client import ToolClient
from worker.constants import MAX_ARGUMENTS_DEPTH
from worker.gateway.mcp.results import CALL_META_KEY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEPTHS = [MAX_ARGUMENTS_DEPTH + 1, 600, 900]
MODERN = "2026-07-28"
TOO_DEEP = f"more than {MAX_ARGUMENTS_DEPTH} levels deep"


def nested(depth: int) -> dict[str, Any]:
    """echo_get's arguments, `depth` levels of objects and arrays in all (the arguments object is one)."""
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return {"item": "deep", "extra": value}


def nested_json(depth: int, before: str, after: str) -> bytes:
    """A JSON body whose arguments are `nested(depth)`, written out as text (json.dumps cannot go as deep)."""
    arguments = '{"item": "deep", "extra": ' + "[" * (depth - 1) + '"leaf"' + "]" * (depth - 1) + "}"
    return (before + arguments + after).encode()


def logs_of(stack: Stack) -> str:
    return (stack.directory / "worker.log").read_text(errors="replace") + stack.gateway.log_text()


def assert_no_traceback(stack: Stack) -> None:
    text = logs_of(stack)
    assert "Traceback" not in text and "RecursionError" not in text, text[-3000:]


@pytest.mark.parametrize("depth", DEPTHS)
def test_client_call_too_deep_is_65(gateway_stack: Stack, depth: int) -> None:
    """Through the Python client and a worker: exit 65 saying how deep is allowed."""
    with ToolClient(gateway_stack.redis.url) as client:
        result = client.call("echo_get", nested(depth), timeout=60)
    assert result.exit_code == 65 and result.error is not None, result.to_dict()
    assert TOO_DEEP in result.error["message"]
    assert_no_traceback(gateway_stack)


def test_the_deepest_allowed_arguments_are_served(gateway_stack: Stack) -> None:
    """Arguments exactly MAX_ARGUMENTS_DEPTH deep are not refused for their depth."""
    with ToolClient(gateway_stack.redis.url) as client:
        result = client.call("echo_get", nested(MAX_ARGUMENTS_DEPTH), timeout=60)
    assert result.exit_code == 0, result.to_dict()


def post_json(stack: Stack, route: str, body: bytes, **headers: str) -> httpx2.Response:
    headers = {**auth(), "Content-Type": "application/json", **headers}
    return httpx2.post(stack.url + route, content=body, headers=headers, timeout=60)


@pytest.mark.parametrize("depth", DEPTHS)
def test_rest_call_too_deep_is_an_envelope_with_65(gateway_stack: Stack, depth: int) -> None:
    """POST /v1/calls answers the 65 envelope, never a 500."""
    body = nested_json(depth, '{"tool": "echo_get", "arguments": ', "}")
    response = post_json(gateway_stack, "/v1/calls", body)
    assert response.status_code == 200, response.text[:2000]
    assert response.json()["exitCode"] == 65 and TOO_DEEP in response.json()["error"]["message"]
    assert_no_traceback(gateway_stack)


@pytest.mark.parametrize("route", ["/v1/calls", "/toolserver/execute_tool"])
def test_a_body_too_deep_to_read_is_400_saying_so(gateway_stack: Stack, route: str) -> None:
    """A body nested past what JSON decoding can read (3000 levels) is a 400 that says it nests too deep,
    not a 500."""
    body = nested_json(3000, '{"tool": "echo_get", "tool_name": "echo_get", "arguments": ', "}")
    response = post_json(gateway_stack, route, body)
    assert response.status_code == 400, response.text[:2000]
    assert f"nests too deep (a call's arguments may nest {MAX_ARGUMENTS_DEPTH} levels at most)" in response.text
    assert_no_traceback(gateway_stack)


@pytest.mark.parametrize("depth", DEPTHS)
def test_toolserver_execute_too_deep_is_422(gateway_stack: Stack, depth: int) -> None:
    """ToolServer's execute_tool answers 422 (invalid arguments) with the envelope, never a 500."""
    body = nested_json(depth, '{"tool_name": "echo_get", "arguments": ', "}")
    response = post_json(gateway_stack, "/toolserver/execute_tool", body)
    assert response.status_code == 422, response.text[:2000]
    assert response.json()["envelope"]["exitCode"] == 65 and TOO_DEEP in response.json()["detail"]
    assert_no_traceback(gateway_stack)


async def test_mcp_call_too_deep_is_a_tool_error(gateway_stack: Stack) -> None:
    """MCP tools/call answers a tool error the model can correct (isError, exit 65), not a protocol error."""
    depth = MAX_ARGUMENTS_DEPTH + 1  # the SDK's client refuses to serialize much deeper arguments itself
    async with (
        httpx2.AsyncClient(headers=auth(), timeout=60) as http,
        Client(streamable_http_client(gateway_stack.url + "/mcp", http_client=http)) as client,
    ):
        result = await client.call_tool("echo_get", nested(depth))
    assert result.is_error is True
    assert result.meta is not None and result.meta[CALL_META_KEY]["exitCode"] == 65
    assert TOO_DEEP in result.content[0].text  # type: ignore[union-attr]
    assert_no_traceback(gateway_stack)


@pytest.mark.parametrize("depth", DEPTHS[1:])
def test_mcp_raw_call_too_deep_is_a_tool_error(gateway_stack: Stack, depth: int) -> None:
    """A tools/call sent as raw JSON-RPC (as a client in another language may) with arguments far too deep is
    a tool error with exit 65, never a 500 or a traceback."""
    meta = json.dumps({PROTOCOL_VERSION_META_KEY: MODERN, CLIENT_CAPABILITIES_META_KEY: {}})
    before = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo_get", "arguments": '
    body = nested_json(depth, before, f', "_meta": {meta}}}}}')
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo_get"}
    response = post_json(gateway_stack, "/mcp", body, Accept="application/json, text/event-stream", **headers)
    assert response.status_code == 200, response.text[:2000]
    result = response.json()["result"]
    assert result["isError"] is True and result["_meta"][CALL_META_KEY]["exitCode"] == 65
    assert TOO_DEEP in result["content"][0]["text"]
    assert_no_traceback(gateway_stack)
