"""A gateway started with only TOOLWORKER_REDIS_URL, in a folder whose ./definitions differ from the
workers': it serves the tools the workers serve. On that gateway, through the MCP SDK's own client: the
catalog tools' annotations, and the text of failed calls with and without a body."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, all_tools, text_of, wait_listening
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MODES = ["legacy", "auto"]
CATALOG_TOOLS = ["catalog_list", "catalog_schema", "catalog_search"]
FLEET_TOOLS = ["fleet_echo", "fleet_status", "fleet_status_head"]
FLEET_DEFINITIONS = """
upstreams:
  local:
    base_url: ${env:TEST_UPSTREAM_URL}
tools:
  - name: fleet_echo
    upstream: local
    description: Echo an item.
    input_schema: {type: object, properties: {item: {type: string}}, required: [item]}
    request: {method: GET, path: "/echo/fleet/${item}"}
  - name: fleet_status
    upstream: local
    description: Answer with the given HTTP status and a short body.
    input_schema: {type: object, properties: {code: {type: integer}}, required: [code]}
    request: {method: GET, path: "/status/${code}"}
  - name: fleet_status_head
    upstream: local
    description: Answer with the given HTTP status and no body (HEAD).
    input_schema: {type: object, properties: {code: {type: integer}}, required: [code]}
    request: {method: HEAD, path: "/status/${code}"}
"""
# What a user's working directory may hold (the repository's demo definitions, say): not what the fleet serves.
LOCAL_DEFINITIONS = """
upstreams:
  demo: {base_url: "http://127.0.0.1:9"}
tools:
  - name: local_only
    upstream: demo
    description: A tool no worker serves.
    request: {method: GET, path: /nowhere}
"""


@dataclass
class Fleet:
    redis: EmbeddedRedis
    upstream_url: str
    directory: Path
    dns_address: str


@pytest.fixture(scope="module")
def fleet(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A Redis of its own and the upstream; workers and gateways are started by each test or fixture."""
    directory = tmp_path_factory.mktemp("fleet")
    for folder, text in (("fleet-definitions", FLEET_DEFINITIONS), ("elsewhere/definitions", LOCAL_DEFINITIONS)):
        (directory / folder).mkdir(parents=True)
        (directory / folder / "tools.yaml").write_text(text)
    server = EmbeddedRedis(directory / "redis").start()
    upstream = ServerThread(make_upstream(UpstreamState())).start()
    yield Fleet(server, upstream.url, directory, dns_server.address)
    upstream.stop()
    server.stop()


def start_fleet_worker(fleet: Fleet, redis_url: str, name: str) -> subprocess.Popen[bytes]:
    env = worker_env(redis_url, fleet.upstream_url, fleet.dns_address, fleet.directory / "fleet-definitions")
    return start_worker(env, fleet.directory / f"{name}.log")


def start_bare_gateway(fleet: Fleet, redis_url: str, name: str) -> Gateway:
    """`toolworker gateway` as a new user starts it: only TOOLWORKER_REDIS_URL, in a folder of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "TEST_", "OTEL_"))}
    env.update(TOOLWORKER_REDIS_URL=redis_url, TOOLWORKER_STORE_POLL_SECONDS="0.2")
    port, log_path = free_port(), fleet.directory / f"{name}.log"
    argv = [sys.executable, "-m", "worker", "gateway", "--port", str(port)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, env=env, cwd=fleet.directory / "elsewhere", stdout=log, stderr=log)
    gateway = Gateway(process, port, log_path, env, ())
    wait_listening(gateway)
    return gateway


@pytest.fixture(scope="module")
def gateway(fleet: Fleet) -> Iterator[Gateway]:
    """A worker on fleet-definitions (answering, so its definitions are announced), then a bare gateway."""
    worker = start_fleet_worker(fleet, fleet.redis.url, "worker")
    started = None
    try:
        with ToolClient(fleet.redis.url) as client:
            assert client.call("fleet_echo", {"item": "warm"}, timeout=60).exit_code == 0
        started = start_bare_gateway(fleet, fleet.redis.url, "gateway")
        yield started
    finally:
        if started is not None:
            started.stop()
        stop_worker(worker)


@asynccontextmanager
async def mcp_client(gateway: Gateway, mode: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(timeout=30) as http,  # no tokens: the gateway serves loopback only
        Client(streamable_http_client(gateway.url + "/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


@pytest.mark.parametrize("mode", MODES)
async def test_a_bare_gateway_serves_the_workers_tools_and_calls_them(gateway: Gateway, mode: str) -> None:
    """tools/list shows the workers' tools (not the gateway folder's ./definitions), and a call works."""
    async with mcp_client(gateway, mode) as client:
        tools = await all_tools(client)
        result = await client.call_tool("fleet_echo", {"item": "A-1"})
    assert sorted(tools) == sorted(CATALOG_TOOLS + FLEET_TOOLS)
    assert result.is_error is False and '"/echo/fleet/A-1"' in text_of(result)


@pytest.mark.parametrize("mode", MODES)
async def test_catalog_tools_are_read_only_idempotent_and_closed_world(gateway: Gateway, mode: str) -> None:
    """catalog_list, catalog_schema and catalog_search only read the catalog, and say so in tools/list (and
    in the REST MCP export)."""
    async with mcp_client(gateway, mode) as client:
        tools = await all_tools(client)
    for name in CATALOG_TOOLS:
        hints = tools[name].annotations  # type: ignore[attr-defined]
        assert (hints.read_only_hint, hints.idempotent_hint, hints.open_world_hint) == (True, True, False), name
    exported = httpx2.get(gateway.url + "/v1/tools", params={"tag": "catalog", "format": "mcp"}, timeout=30).json()
    assert {t["name"]: t["annotations"]["openWorldHint"] for t in exported["tools"]} == dict.fromkeys(
        CATALOG_TOOLS, False
    )


@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_call_reads_as_the_message_then_the_body(gateway: Gateway, mode: str) -> None:
    """A 404 with a body: the text is the error message, then the body under a label; no `result` field named."""
    async with mcp_client(gateway, mode) as client:
        result = await client.call_tool("fleet_status", {"code": 404})
    assert result.is_error is True
    expected = "The call failed: the upstream answered HTTP 404 Not Found.\n\nThe response body:\nupstream says 404"
    assert text_of(result) == expected


@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_call_without_a_body_says_the_body_was_empty(gateway: Gateway, mode: str) -> None:
    """A 404 with no body (HEAD): the text says the body was empty, and points at nothing else."""
    async with mcp_client(gateway, mode) as client:
        result = await client.call_tool("fleet_status_head", {"code": 404})
    assert result.is_error is True
    assert text_of(result) == "The call failed: the upstream answered HTTP 404 Not Found, with an empty body."


def test_a_gateway_started_before_any_worker_takes_the_workers_tools_when_one_starts(
    fleet: Fleet, tmp_path: Path
) -> None:
    """On a Redis where no worker has announced its definitions, the gateway serves its own folder (and
    logs a warning saying so); once a worker starts, it serves the worker's tools."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    gateway = start_bare_gateway(fleet, server.url, "early-gateway")
    worker = None
    try:
        assert tool_names(gateway) == {"local_only", *CATALOG_TOOLS}
        assert "gateway.no_worker_definitions" in gateway.log_text()
        worker = start_fleet_worker(fleet, server.url, "late-worker")
        deadline = time.monotonic() + 60
        while tool_names(gateway) != {*FLEET_TOOLS, *CATALOG_TOOLS}:
            assert time.monotonic() < deadline, (tool_names(gateway), gateway.log_text()[-2000:])
            time.sleep(0.1)  # the gateway looks every 0.2 s; nothing to wait on from outside
    finally:
        gateway.stop()
        if worker is not None:
            stop_worker(worker)
        server.stop()


def tool_names(gateway: Gateway) -> set[str]:
    return {tool["name"] for tool in httpx2.get(gateway.url + "/v1/tools", timeout=30).json()["tools"]}
