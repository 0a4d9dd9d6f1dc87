"""MCP through the gateway with the SDK's own client: Streamable HTTP in both protocol generations, stdio."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
import redis
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from tests.support.gateway_stack import HELD_QUEUE, OTHER_TOKEN, TOKEN, Stack, auth, gateway_env, text_of
from worker.gateway.mcp.results import CALL_META_KEY
from worker.gateway.mcp.server import CALL_ID_META_KEY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MODES = ["legacy", "auto"]  # the initialize handshake, and 2026-07-28 after `server/discover`
ALL_TOOLS = [
    "catalog_list", "catalog_schema", "catalog_search", "echo_delete", "echo_get", "echo_post", "echo_put",
    "held_echo", "slow", "status", "whoami",
]  # fmt: skip


@asynccontextmanager
async def mcp_client(stack: Stack, mode: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={**auth(), **(headers or {})}, timeout=30) as http:
        transport = streamable_http_client(stack.url + "/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            expected = "2026-07-28" if mode == "auto" else None
            assert client.protocol_version == expected or (
                expected is None and client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            )
            yield client


@pytest.mark.parametrize("mode", MODES)
async def test_tools_list_pages_through_every_tool_in_order(gateway_stack: Stack, mode: str) -> None:
    """tools/list gives every tool once, by name, over pages behind opaque cursors."""
    async with mcp_client(gateway_stack, mode) as client:
        names, cursor, pages = [], None, 0
        while True:
            page = await client.list_tools(cursor=cursor)
            names += [tool.name for tool in page.tools]
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
            assert "echo" not in cursor  # opaque
    assert names == ALL_TOOLS
    assert pages == 3  # 11 tools, 4 a page


@pytest.mark.parametrize("mode", MODES)
async def test_tools_carry_annotations_and_schemas(gateway_stack: Stack, mode: str) -> None:
    """Annotations come from the method; input schemas are JSON Schema objects; no outputSchema."""
    async with mcp_client(gateway_stack, mode) as client:
        tools = {}
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.update({tool.name: tool for tool in page.tools})
            if (cursor := page.next_cursor) is None:
                break
    hints = {name: tools[name].annotations for name in ("echo_get", "echo_put", "echo_delete", "echo_post")}
    assert hints["echo_get"].read_only_hint is True
    assert hints["echo_put"].idempotent_hint is True and hints["echo_put"].destructive_hint is False
    assert hints["echo_delete"].destructive_hint is True and hints["echo_delete"].idempotent_hint is True
    assert hints["echo_post"].idempotent_hint is False and hints["echo_post"].read_only_hint is False
    schema = tools["echo_get"].input_schema
    assert schema["type"] == "object" and schema["required"] == ["item"]
    assert all(tool.output_schema is None for tool in tools.values())


async def test_modern_tools_list_carries_cache_hints(gateway_stack: Stack) -> None:
    """A 2026-07-28 tools/list result says how long it stays fresh (until the gateway's next look for the
    workers' definitions, every TOOLWORKER_STORE_POLL_SECONDS), for everyone."""
    async with mcp_client(gateway_stack, "auto") as client:
        page = await client.list_tools()
    assert page.ttl_ms == 2_000 and page.cache_scope == "public"


@pytest.mark.parametrize("mode", MODES)
async def test_invalid_cursor_is_error_32602(gateway_stack: Stack, mode: str) -> None:
    """A cursor the gateway did not give is a JSON-RPC invalid-params error."""
    async with mcp_client(gateway_stack, mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.list_tools(cursor="not-a-cursor")
    assert caught.value.error.code == -32602


@pytest.mark.parametrize("mode", MODES)
async def test_call_answers_with_the_envelope_result(gateway_stack: Stack, mode: str) -> None:
    """tools/call text is the envelope's result; _meta carries callId, statusCode, exitCode, attempts."""
    async with mcp_client(gateway_stack, mode) as client:
        result = await client.call_tool("echo_get", {"item": "A-1"})
    meta = result.meta[CALL_META_KEY]  # type: ignore[index]
    assert result.is_error is False
    assert meta["exitCode"] == 0 and meta["statusCode"] == 200 and meta["attempts"] == 1
    assert meta["truncated"] is False
    stored = httpx2.get(f"{gateway_stack.url}/v1/calls/{meta['callId']}", headers=auth()).json()
    assert text_of(result) == stored["result"]
    assert json.loads(text_of(result))["path"] == "/echo/items/A-1"


@pytest.mark.parametrize("mode", MODES)
async def test_upstream_404_is_a_tool_error(gateway_stack: Stack, mode: str) -> None:
    """A non-2xx upstream answer is isError with the error message, then the body."""
    async with mcp_client(gateway_stack, mode) as client:
        result = await client.call_tool("status", {"code": 404})
    assert result.is_error is True
    assert result.meta[CALL_META_KEY]["exitCode"] == 22  # type: ignore[index]
    assert result.meta[CALL_META_KEY]["statusCode"] == 404  # type: ignore[index]
    assert "404" in text_of(result) and text_of(result).endswith("upstream says 404")


@pytest.mark.parametrize("mode", MODES)
async def test_invalid_arguments_are_a_tool_error_naming_the_field(gateway_stack: Stack, mode: str) -> None:
    """Arguments the schema refuses come back as isError naming the field (exit 65), not a protocol error."""
    async with mcp_client(gateway_stack, mode) as client:
        result = await client.call_tool("echo_get", {"limit": "ten"})
    assert result.is_error is True
    assert result.meta[CALL_META_KEY]["exitCode"] == 65  # type: ignore[index]
    assert "`item`" in text_of(result) and "`limit`" in text_of(result)


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_tool_is_a_jsonrpc_error(gateway_stack: Stack, mode: str) -> None:
    """Calling a tool the gateway does not offer is a JSON-RPC error, and nothing is enqueued."""
    async with mcp_client(gateway_stack, mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("no_such_tool", {})
    assert caught.value.error.code == -32602
    assert "no_such_tool" in caught.value.error.message


@pytest.mark.parametrize("mode", MODES)
async def test_session_header_is_forwarded_but_not_the_gateway_token(gateway_stack: Stack, mode: str) -> None:
    """X-User-Token (overridable at the upstream) reaches it; the gateway's own Authorization does not."""
    user_token = f"user-{uuid.uuid4().hex}"
    async with mcp_client(gateway_stack, mode, {"X-User-Token": user_token, "X-Not-Listed": "nope"}) as client:
        result = await client.call_tool("whoami", {})
    assert result.is_error is False
    seen = next(h for h in reversed(gateway_stack.recorder.seen) if h.get("x-user-token") == user_token)
    assert seen["authorization"] == "Bearer s3cr3t-env-token-4242"  # the upstream's own, from the worker
    assert TOKEN not in json.dumps(seen) and "x-not-listed" not in seen


@pytest.mark.parametrize("mode", MODES)
async def test_same_call_id_gets_the_same_envelope(gateway_stack: Stack, mode: str) -> None:
    """A request sent again with the same callId is answered from the first call, not run twice."""
    call_id = f"mcp-{mode}-{uuid.uuid4().hex}"
    meta = {CALL_ID_META_KEY: call_id}
    async with mcp_client(gateway_stack, mode) as client:
        first = await client.call_tool("echo_post", {"title": call_id}, meta=meta)
        again = await client.call_tool("echo_post", {"title": call_id}, meta=meta)
    assert first.meta[CALL_META_KEY] == again.meta[CALL_META_KEY]  # type: ignore[index]
    assert first.meta[CALL_META_KEY]["callId"] == call_id  # type: ignore[index]
    assert text_of(first) == text_of(again)
    assert gateway_stack.upstream_state.hits.count(("POST", "/echo/create")) >= 1
    posts = [hit for hit in gateway_stack.upstream_state.hits if hit == ("POST", "/echo/create")]
    async with mcp_client(gateway_stack, mode) as client:
        with pytest.raises(MCPError) as caught:  # the same callId for another call
            await client.call_tool("echo_post", {"title": "other"}, meta=meta)
    assert "already names a call" in caught.value.error.message
    assert [hit for hit in gateway_stack.upstream_state.hits if hit == ("POST", "/echo/create")] == posts


@pytest.mark.parametrize("mode", MODES)
async def test_cancelled_call_is_taken_off_the_queue(gateway_stack: Stack, mode: str) -> None:
    """Cancelling a call no worker has started removes it from its queue: it will never run."""
    call_id = f"cancel-{mode}-{uuid.uuid4().hex}"
    client_redis = redis.Redis.from_url(gateway_stack.redis.url)
    try:
        async with mcp_client(gateway_stack, mode) as client:
            with anyio.move_on_after(2):
                waiting = client.call_tool("held_echo", {"item": call_id}, meta={CALL_ID_META_KEY: call_id})
                async with anyio.create_task_group() as group:
                    group.start_soon(_expect_cancelled, waiting)
                    await _until(lambda: _queued(client_redis, call_id))
                    group.cancel_scope.cancel()
        await _until(lambda: not _queued(client_redis, call_id))
        status = httpx2.get(f"{gateway_stack.url}/v1/calls/{call_id}", headers=auth())
        assert status.status_code == 404  # withdrawn: the callId is free again
    finally:
        client_redis.close()


async def _expect_cancelled(call: object) -> None:
    await call  # type: ignore[misc]
    raise AssertionError("the held call was answered")


def _queued(client: redis.Redis, call_id: str) -> bool:
    return any(call_id.encode() in message for message in client.lrange(HELD_QUEUE, 0, -1))  # type: ignore[union-attr]


async def _until(condition: object, timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.02)


async def test_request_without_token_is_401(gateway_stack: Stack) -> None:
    """Without a bearer token (or with a wrong one) /mcp answers 401 and the SDK client fails."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    bare = httpx2.post(gateway_stack.url + "/mcp", json=body, headers=headers)
    wrong = httpx2.post(gateway_stack.url + "/mcp", json=body, headers={**headers, **auth("wrong")})
    assert bare.status_code == wrong.status_code == 401
    assert bare.headers["www-authenticate"].startswith("Bearer")
    assert bare.json()["error"]["type"] == "unauthorized"
    async with httpx2.AsyncClient(timeout=10) as http:
        with pytest.raises(Exception):  # noqa: B017  # the SDK reports the 401 as its own error type
            async with Client(streamable_http_client(gateway_stack.url + "/mcp", http_client=http), mode="legacy"):
                pass


async def test_second_token_is_accepted(gateway_stack: Stack) -> None:
    """Every configured token opens the gateway."""
    async with httpx2.AsyncClient(headers=auth(OTHER_TOKEN), timeout=30) as http:
        transport = streamable_http_client(gateway_stack.url + "/mcp", http_client=http)
        async with Client(transport, mode="legacy") as client:
            assert (await client.call_tool("echo_get", {"item": "x"})).is_error is False


def test_wrong_origin_is_refused(gateway_stack: Stack) -> None:
    """A browser page from another origin cannot reach /mcp, even with a token; loopback pages can."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {**auth(), "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    refused = httpx2.post(gateway_stack.url + "/mcp", json=body, headers={**headers, "Origin": "https://evil.example"})
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden_origin"
    local = httpx2.post(gateway_stack.url + "/mcp", json=body, headers={**headers, "Origin": "http://localhost:3000"})
    assert local.status_code != 403


async def test_stdio_server_lists_and_calls(gateway_stack: Stack) -> None:
    """`python -m worker mcp` speaks MCP on stdio to the SDK's stdio client (legacy and 2026-07-28)."""
    env = gateway_env(gateway_stack.redis.url)
    params = StdioServerParameters(command=sys.executable, args=["-m", "worker", "mcp", "--tag", "echo"], env=env)
    for mode in MODES:
        async with Client(params, mode=mode) as client:
            page = await client.list_tools()
            assert [tool.name for tool in page.tools] == ["echo_delete", "echo_get", "echo_post", "echo_put"]
            result = await client.call_tool("echo_get", {"item": "stdio"})
            assert result.is_error is False and json.loads(text_of(result))["path"] == "/echo/items/stdio"
            with pytest.raises(MCPError):
                await client.call_tool("status", {"code": 200})  # not offered under --tag echo


@pytest.mark.parametrize("mode", MODES)
async def test_long_call_reports_progress(gateway_stack: Stack, mode: str) -> None:
    """A client that asks for progress hears from a call that waits, then gets its result."""
    reports: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append(progress)

    async with mcp_client(gateway_stack, mode) as client:
        result = await client.call_tool("slow", {"delay": 2.5}, progress_callback=on_progress)
    assert result.is_error is False and json.loads(text_of(result)) == {"slow": True}
    assert reports and reports == sorted(reports)
