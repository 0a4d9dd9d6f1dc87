"""Structured output and cache hits through the gateway, with the MCP SDK's own client in both protocol
generations, for tools imported from a live FastAPI app's OpenAPI document."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx2
import pytest
import redis
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, all_tools, auth, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer
from tests.support.shop_app import ShopServer
from worker.constants import RESULT_KEY_PREFIX
from worker.dev.embedded import EmbeddedRedis
from worker.gateway.mcp.output import NOT_STRUCTURED
from worker.gateway.mcp.results import CALL_META_KEY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
MODES = ["legacy", "auto"]  # the initialize handshake (2025-11-25 and before), and 2026-07-28
DEFINITIONS = """
upstreams:
  shop_cached:
    base_url: {url}
    cache: {{ttl_seconds: 60}}
openapi:
  - {{upstream: shop, spec: shop.json, base_url: "{url}", include_tags: [items]}}
  - {{upstream: shop_cached, spec: shop.json, include_tags: [cached]}}
"""


@dataclass
class ShopStack:
    shop: ShopServer
    gateway: Gateway
    redis: redis.Redis
    worker: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="module")
def shop_stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShopStack]:
    """The live app, its OpenAPI document imported into a definitions folder, a worker and a gateway on it."""
    directory = tmp_path_factory.mktemp("shop")
    shop = ShopServer().start()
    definitions = directory / "definitions"
    definitions.mkdir()
    spec = httpx2.get(shop.url + "/openapi.json", timeout=10).json()
    (definitions / "shop.json").write_text(json.dumps(spec))
    (definitions / "shop.yaml").write_text(DEFINITIONS.format(url=shop.url))
    server = EmbeddedRedis(directory / "redis").start()
    worker = start_worker(worker_env(server.url, shop.url, dns_server.address, definitions), directory / "worker.log")
    gateway = None
    try:
        gateway = start_gateway(gateway_env(server.url, definitions), directory / "gateway.log")
        wait_listening(gateway, ready=True)
        yield ShopStack(shop, gateway, redis.Redis.from_url(server.url), worker)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        server.stop()
        shop.stop()


@asynccontextmanager
async def mcp_client(stack: ShopStack, mode: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=auth(), timeout=60) as http,
        Client(streamable_http_client(stack.url + "/mcp", http_client=http), mode=mode) as client,
    ):
        assert (client.protocol_version == "2026-07-28") == (mode == "auto")
        yield client


@pytest.mark.parametrize("mode", MODES)
async def test_output_schemas_from_the_openapi_document(shop_stack: ShopStack, mode: str) -> None:
    """Each imported tool lists its 2xx JSON schema, $refs resolved; an array root is wrapped for older revisions."""
    async with mcp_client(shop_stack, mode) as client:
        tools = await all_tools(client)
    item = tools["get_item"].output_schema  # type: ignore[attr-defined]
    assert item["type"] == "object" and set(item["required"]) == {"id", "name"}
    page = tools["get_page"].output_schema  # type: ignore[attr-defined]
    assert page["properties"]["items"]["items"]["properties"]["id"]["type"] == "integer"  # the $ref, resolved
    assert "$ref" not in json.dumps(page)
    array = tools["list_items"].output_schema  # type: ignore[attr-defined]
    if mode == "auto":
        assert array["type"] == "array" and array["items"]["properties"]["id"]["type"] == "integer"
    else:
        assert array["type"] == "object" and array["required"] == ["items"]
        assert array["properties"]["items"]["type"] == "array"


@pytest.mark.parametrize("mode", MODES)
async def test_structured_content_conforms_for_the_sdk_client(shop_stack: ShopStack, mode: str) -> None:
    """The SDK client validates structuredContent against outputSchema (it raises otherwise) for objects, nested
    $refs and arrays (wrapped as {"items": [...]} before 2026-07-28)."""
    async with mcp_client(shop_stack, mode) as client:
        await all_tools(client)  # the client keeps the output schemas it validates with
        item = await client.call_tool("get_item", {"item_id": 4})
        page = await client.call_tool("get_page", {})
        items = await client.call_tool("list_items", {"count": 2})
    assert item.is_error is False and item.structured_content == {"id": 4, "name": "item 4", "tags": ["new"]}
    assert json.loads(item.content[0].text) == item.structured_content  # type: ignore[union-attr]
    assert page.structured_content == {"items": [{"id": 1, "name": "one", "tags": []}], "total": 1}
    expected = [{"id": 0, "name": "item 0", "tags": []}, {"id": 1, "name": "item 1", "tags": []}]
    assert items.structured_content == (expected if mode == "auto" else {"items": expected})


@pytest.mark.parametrize("mode", MODES)
async def test_a_body_that_breaks_its_schema_is_text_with_a_note(shop_stack: ShopStack, mode: str) -> None:
    """A body its schema refuses is never a structuredContent the client would reject: a tool error, the text
    and a note saying why."""
    async with mcp_client(shop_stack, mode) as client:
        await all_tools(client)
        result = await client.call_tool("get_broken", {})
    assert result.is_error is True and result.structured_content is None
    texts = [block.text for block in result.content]  # type: ignore[union-attr]
    assert json.loads(texts[0]) == {"id": "not a number", "name": 7}
    assert NOT_STRUCTURED in texts[1] and "output schema" in texts[1]
    envelope = httpx2.get(
        f"{shop_stack.url}/v1/calls/{result.meta[CALL_META_KEY]['callId']}", headers=auth(), timeout=10
    ).json()  # type: ignore[index]
    assert (
        envelope["exitCode"] == 0 and envelope.get("structuredContent") is None and "output schema" in envelope["note"]
    )


async def test_rest_envelope_carries_the_parsed_value(shop_stack: ShopStack) -> None:
    """REST /v1/calls answers with the envelope, whose structuredContent is the parsed body."""
    body = {"tool": "get_item", "arguments": {"item_id": 9}, "wait": True}
    envelope = httpx2.post(shop_stack.url + "/v1/calls", json=body, headers=auth(), timeout=60).json()
    assert envelope["structuredContent"] == {"id": 9, "name": "item 9", "tags": ["new"]}
    assert "cached" not in envelope and "truncation" not in envelope


async def test_cache_hits_through_the_gateway_without_the_queue(shop_stack: ShopStack) -> None:
    """Once cached, a call is answered by the gateway itself: no upstream request, no message, no worker
    (the worker is stopped), over MCP in both generations and REST. Last in this module: it stops the worker."""
    async with mcp_client(shop_stack, "auto") as client:
        miss = await client.call_tool("get_cached", {"item_id": 5})
    assert miss.meta[CALL_META_KEY].get("cached") is None  # type: ignore[index]
    assert shop_stack.shop.hits["/cached/5"] == 1
    stop_worker(shop_stack.worker)
    call_ids = []
    for mode in MODES:
        async with mcp_client(shop_stack, mode) as client:
            await all_tools(client)
            hit = await client.call_tool("get_cached", {"item_id": 5})
        meta = hit.meta[CALL_META_KEY]  # type: ignore[index]
        assert hit.is_error is False and meta["cached"] is True and meta["age"] >= 0
        assert hit.structured_content == {"id": 5, "name": "cached 5", "tags": []}
        call_ids.append(meta["callId"])
    body = {"tool": "get_cached", "arguments": {"item_id": 5}}  # wait: false, yet a hit is ready
    rest = httpx2.post(shop_stack.url + "/v1/calls", json=body, headers=auth(), timeout=30)
    assert rest.status_code == 200 and rest.json()["cached"] is True
    call_ids.append(rest.json()["callId"])
    assert shop_stack.shop.hits["/cached/5"] == 1
    assert not any(shop_stack.redis.exists(RESULT_KEY_PREFIX + call_id) for call_id in call_ids)  # no worker answered
    metrics = httpx2.get(shop_stack.url + "/metrics", headers=auth(), timeout=10).text
    assert 'toolworker_gateway_cache_hits_total{tool="get_cached"} 3.0' in metrics
