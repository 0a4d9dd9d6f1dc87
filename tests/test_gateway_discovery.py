"""Discovery mode on a generated 500-operation spec, and tool-list changes reaching MCP clients."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import redis
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ToolsListChanged

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import DEFINITIONS, Gateway, auth, gateway_env, start_gateway, wait_listening
from tests.support.openapi_gen import write_spec
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from worker.definitions import redis_store
from worker.dev.embedded import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
OPERATIONS = 500


@dataclass
class DiscoveryStack:
    redis: EmbeddedRedis
    gateway: Gateway
    directory: Path


@pytest.fixture(scope="module")
def discovery_stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DiscoveryStack]:
    """A worker and a `--mode discovery` gateway on a generated spec whose operations reach the echo upstream."""
    directory = tmp_path_factory.mktemp("discovery")
    definitions = directory / "definitions"
    definitions.mkdir()
    write_spec(definitions, OPERATIONS)
    entry = '  - {upstream: generated, spec: generated.json, base_url: "${env:TEST_UPSTREAM_URL}/echo"}\n'
    (definitions / "generated-tools.yaml").write_text("openapi:\n" + entry)
    server = EmbeddedRedis(directory / "redis").start()
    upstream = ServerThread(make_upstream(UpstreamState())).start()
    worker = start_worker(worker_env(server.url, upstream.url, dns_server.address, definitions), directory / "w.log")
    gateway = None
    try:
        env = gateway_env(server.url, definitions)
        gateway = start_gateway(env, directory / "gateway.log", None, "--mode", "discovery")
        wait_listening(gateway, ready=True)
        yield DiscoveryStack(server, gateway, directory)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


@asynccontextmanager
async def client_of(url: str, mode: str = "auto") -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=auth(), timeout=60) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


async def meta_call(client: Client, name: str, arguments: dict[str, Any]) -> Any:
    result = await client.call_tool(name, arguments)
    assert result.is_error is False, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_discovery_mode_lists_only_the_meta_tools(discovery_stack: DiscoveryStack, mode: str) -> None:
    """A 500-operation catalog is offered as four meta-tools."""
    async with client_of(discovery_stack.gateway.url, mode) as client:
        page = await client.list_tools()
    assert [tool.name for tool in page.tools] == ["list_tools", "search_tools", "get_tool_schema", "call_tool"]
    assert page.next_cursor is None


async def test_a_model_finds_and_calls_a_tool_through_the_meta_tools(discovery_stack: DiscoveryStack) -> None:
    """Tags, then a tag's tools, a search, the schema, and a call by name: end to end through a worker."""
    async with client_of(discovery_stack.gateway.url) as client:
        overview = await meta_call(client, "list_tools", {})
        # The operations, and the three catalog tools the workers answer themselves.
        assert overview["total"] == OPERATIONS + 3 and len(overview["tools"]) == 50 and "nextCursor" in overview
        # The generator has a "catalog" tag of its own; the three catalog tools add to it.
        assert overview["tags"]["billing"] == 50 and overview["tags"]["catalog"] == 53 and len(overview["tags"]) == 10
        second = await meta_call(client, "list_tools", {"cursor": overview["nextCursor"]})
        assert {t["name"] for t in second["tools"]}.isdisjoint(t["name"] for t in overview["tools"])
        billing = await meta_call(client, "list_tools", {"tags": ["billing"]})
        assert billing["total"] == 50 and {t["upstream"] for t in billing["tools"]} == {"generated"}
        found = await meta_call(client, "search_tools", {"question": "Fetch one billing resource 0 item by ID"})
        assert found[0]["name"] == "getResource0"
        schemas = await meta_call(client, "get_tool_schema", {"names": ["getResource0", "noSuchTool"]})
        assert schemas["missing"] == ["noSuchTool"]
        [schema] = schemas["tools"]
        assert "itemId" in schema["inputSchema"]["properties"] and schema["annotations"]["readOnlyHint"] is True
        result = await client.call_tool("call_tool", {"name": "getResource0", "arguments": {"itemId": "it-7"}})
    assert result.is_error is False
    assert json.loads(result.content[0].text)["path"] == "/echo/billing/resource0/it-7"  # type: ignore[union-attr]
    assert result.meta["toolworker/call"]["statusCode"] == 200  # type: ignore[index]


async def test_meta_tool_errors_name_the_field_or_the_tool(discovery_stack: DiscoveryStack) -> None:
    """Bad meta-tool arguments are a tool error naming the field; an unknown tool is a JSON-RPC error."""
    async with client_of(discovery_stack.gateway.url) as client:
        missing = await client.call_tool("search_tools", {})
        bad_cursor = await client.call_tool("list_tools", {"cursor": "%%%"})
        with pytest.raises(MCPError) as caught:
            await client.call_tool("call_tool", {"name": "noSuchTool", "arguments": {}})
    assert missing.is_error is True and "question" in missing.content[0].text  # type: ignore[union-attr]
    assert bad_cursor.is_error is True and "cursor" in bad_cursor.content[0].text  # type: ignore[union-attr]
    assert caught.value.error.code == -32602


# --- a new definitions version reaches clients ------------------------------------------------------


def publish(redis_url: str, folder: Path) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        version, toolset = redis_store.publish(client, [folder])
    finally:
        client.close()
    assert version, toolset.problems
    return version


def with_extra_tool(base: Path, folder: Path, name: str) -> Path:
    folder.mkdir()
    (folder / "tools.yaml").write_text((base / "tools.yaml").read_text())
    extra = f"tools:\n  - name: {name}\n    upstream: local\n    request: {{method: GET, path: /echo/{name}}}\n"
    (folder / "extra.yaml").write_text(extra)
    return folder


@pytest.fixture(scope="module")
def redis_store_gateway(discovery_stack: DiscoveryStack) -> Iterator[Gateway]:
    """A gateway serving what `toolworker publish` stored, looking for a new version every 0.2 s."""
    publish(discovery_stack.redis.url, DEFINITIONS)
    env = gateway_env(discovery_stack.redis.url, TOOLWORKER_STORE="redis", TOOLWORKER_STORE_POLL_SECONDS="0.2")
    gateway = start_gateway(env, discovery_stack.directory / "store-gateway.log")
    yield gateway
    gateway.stop()


async def test_new_version_reaches_a_listening_2026_client(
    redis_store_gateway: Gateway, discovery_stack: DiscoveryStack, tmp_path: Path
) -> None:
    """A 2026-07-28 client listening for changes hears of a new version, and the next list has its tool."""
    async with client_of(redis_store_gateway.url) as client:
        before = await client.list_tools()
        assert before.ttl_ms == 200
        async with client.listen(tools_list_changed=True) as subscription:
            publish(discovery_stack.redis.url, with_extra_tool(DEFINITIONS, tmp_path / "v2", "added_tool"))
            with anyio.fail_after(20):
                event = await subscription.__anext__()
        assert isinstance(event, ToolsListChanged)
        names = await _all_names(client)
    assert "added_tool" in names and "added_tool" not in [tool.name for tool in before.tools]


async def test_new_version_reaches_a_legacy_stdio_client(
    redis_store_gateway: Gateway, discovery_stack: DiscoveryStack, tmp_path: Path
) -> None:
    """A handshake-era client on stdio gets notifications/tools/list_changed when a version is published."""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        notification = getattr(message, "root", message)  # a ServerNotification wraps the typed one
        if isinstance(notification, types.ToolListChangedNotification):
            changed.set()

    env = gateway_env(discovery_stack.redis.url, TOOLWORKER_STORE="redis", TOOLWORKER_STORE_POLL_SECONDS="0.2")
    params = StdioServerParameters(command=sys.executable, args=["-m", "worker", "mcp"], env=env)
    async with Client(params, mode="legacy", message_handler=on_message) as client:
        assert client.server_capabilities.tools is not None and client.server_capabilities.tools.list_changed
        await client.list_tools()  # the session the notification goes to
        publish(discovery_stack.redis.url, with_extra_tool(DEFINITIONS, tmp_path / "v3", "stdio_added"))
        with anyio.fail_after(20):
            await changed.wait()
        assert "stdio_added" in await _all_names(client)


async def _all_names(client: Client) -> list[str]:
    names, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        names += [tool.name for tool in page.tools]
        if (cursor := page.next_cursor) is None:
            return names
