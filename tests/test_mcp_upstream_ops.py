"""Operating MCP upstreams (docs/guides/mcp-upstreams.md): a server that says its tools changed is read again
(once per burst), a server never listed still gets the calls of its prefix, and a server killed and restarted
under load loses no call. Real servers (the `mcp` SDK's `MCPServer`) and a real worker, on loopback."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
import redis
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult
from playwright.sync_api import Page

from tests.conftest import start_worker, stop_worker
from tests.support.browser import browser, page
from tests.support.gateway_stack import Gateway, auth, gateway_env, start_gateway, wait_listening
from tests.support.mcp_servers import McpServerProcess, sdk_server
from tests.support.waiting import wait_until
from worker.client import ToolClient
from worker.definitions import listings
from worker.definitions.mcp_tools import Listing, unlisted_tool, with_listings
from worker.definitions.model import McpServer, ToolSet, Upstream
from worker.definitions.templates import Template
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.envelope import ToolResult
from worker.upstreams.changes import ChangedTools

pytestmark = pytest.mark.timeout(240)
T = TypeVar("T")
__all__ = ["browser", "page"]


def growing(sse: bool = False) -> McpServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.mcp_growing_server", str(port), *(["sse"] if sse else [])]
    return McpServerProcess(argv, port, path="/sse" if sse else "/mcp")


# --- the burst ----------------------------------------------------------------------------------


class CountingRefresher:
    """Stands in for the Refresher (Redis and a server) to count what ChangedTools asks of it."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.gate = asyncio.Event()

    async def refresh_since(self, upstream: Upstream, noticed: float) -> None:
        self.asked.append(noticed)
        await self.gate.wait()


def test_a_burst_of_notifications_refreshes_once_and_one_during_it_once_more() -> None:
    """Ten notices at once: one refresh; a notice while it runs: one more after it, none after that."""
    url = Template.literal("http://x/mcp")
    toolset = ToolSet({"docs": Upstream("docs", url, mcp=McpServer(url))})

    async def run() -> list[float]:
        refresher = CountingRefresher()
        changes = ChangedTools(refresher, lambda: toolset, settle_s=0.01)  # type: ignore[arg-type]  # a counter
        for _ in range(10):
            changes.changed("docs")
        while not refresher.asked:
            await asyncio.sleep(0.01)
        changes.changed("docs")  # during the refresh
        changes.changed("docs")
        refresher.gate.set()
        while len(refresher.asked) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        await changes.close()
        return refresher.asked

    asked = asyncio.run(run())
    assert len(asked) == 2 and asked[0] < asked[1], asked


# --- not listed yet -----------------------------------------------------------------------------


def test_a_call_to_an_unlisted_upstreams_prefix_names_the_servers_tool(tmp_path: Path) -> None:
    """Never listed: `later_add` is the server's `add`; include/exclude still apply; a listed one is as listed."""
    url = Template.literal("http://x/mcp")
    later = Upstream("later", url, mcp=McpServer(url, exclude=("secret",)))
    toolset = with_listings(ToolSet({"later": later}), {"later": Listing("later", error="401 Unauthorized")})
    assert "calls to later_* are sent to it" in str(toolset.notices[-1]) and "401" in str(toolset.notices[-1])
    tool = unlisted_tool(toolset, "later_add")
    assert tool is not None and tool.upstream == "later" and tool.remote_name == "add"
    assert unlisted_tool(toolset, "later_secret") is None and unlisted_tool(toolset, "other_add") is None
    listed = with_listings(ToolSet({"later": later}), {"later": Listing("later", {"x": {"name": "x"}}, listed_at=1.0)})
    assert unlisted_tool(listed, "later_add") is None and "later_x" in listed.tools


# --- with a worker ------------------------------------------------------------------------------


@dataclass
class Stack:
    redis: EmbeddedRedis
    env: dict[str, str]
    log_path: Path
    servers: dict[str, McpServerProcess]
    definitions: Path

    def listing(self, upstream: str) -> Listing | None:
        client = redis.Redis.from_url(self.redis.url)
        try:
            return listings.read(client).get(upstream)
        finally:
            client.close()


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "worker", *args]
    return subprocess.run(argv, env=stack.env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    servers = {"grow": growing().start(), "oldgrow": growing(sse=True).start(), "sdk": sdk_server().start()}
    servers["pinned"] = growing().start()
    later = sdk_server()  # not started before the first refresh: never listed
    folder = tmp_path_factory.mktemp("mcp-ops-defs")
    (folder / "mcp.yaml").write_text(
        "upstreams:\n"
        f"  grow: {{mcp: {{url: '{servers['grow'].url}', refresh_seconds: 3600}}}}\n"
        f"  oldgrow: {{mcp: {{url: '{servers['oldgrow'].url}', transport: sse, refresh_seconds: 3600}}}}\n"
        f"  sdk: {{mcp: {{url: '{servers['sdk'].url}', refresh_seconds: 3600}}, timeout_seconds: 10,"
        " connect_timeout_seconds: 1}\n"
        f"  later: {{mcp: {{url: '{later.url}', refresh_seconds: 3600}}, connect_timeout_seconds: 1}}\n"
        f"  pinned: {{mcp: {{url: '{servers['pinned'].url}', refresh_seconds: 3600, pin: true}}}}\n"
    )
    db = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env.update(TOOLWORKER_REDIS_URL=db.url, TOOLWORKER_DEFINITIONS=str(folder), TOOLWORKER_METRICS_PORT="0")
    env.update(TOOLWORKER_STORE_POLL_SECONDS="0.5")
    made = Stack(db, env, tmp_path_factory.mktemp("logs") / "worker.log", servers, folder)
    for name in ("grow", "oldgrow", "sdk", "later", "pinned"):
        assert cli(made, "upstreams", "refresh", name).returncode == 0
    servers["later"] = later.start()
    yield made
    for server in servers.values():
        server.kill()
    db.stop()


@pytest.fixture(scope="module")
def worker_client(stack: Stack) -> Iterator[ToolClient]:
    process = start_worker(stack.env, stack.log_path)
    with ToolClient(stack.redis.url) as client:
        first = client.call("sdk_add", {"a": 1, "b": 1}, timeout=90)
        assert first.exit_code == 0, (first.to_dict(), stack.log_path.read_text()[-3000:])
        yield client
    stop_worker(process)


@pytest.mark.integration
@pytest.mark.parametrize("upstream", ["grow", "oldgrow"])
def test_a_server_that_says_its_tools_changed_is_read_again(
    stack: Stack, worker_client: ToolClient, upstream: str
) -> None:
    """2026-07-28 (a `subscriptions/listen` stream) and the HTTP+SSE transport: the worker's session hears
    `notifications/tools/list_changed`, the listing is read again long before `refresh_seconds`, and the
    new tool is called through the worker."""
    grown = worker_client.call(f"{upstream}_grow", {"name": "fresh"}, timeout=60)
    assert grown.exit_code == 0, grown.to_dict()

    def listed() -> bool:
        listing = stack.listing(upstream)
        return listing is not None and "fresh" in listing.tools

    wait_until(listed, 30, f"{upstream}'s listing with the tool it grew")
    answers: list[ToolResult] = []

    def served() -> bool:  # the worker serves a new listing once its poll has seen it
        answers.append(worker_client.call(f"{upstream}_fresh", {}, timeout=60))
        return answers[-1].exit_code != 64

    wait_until(served, 30, f"the worker serving {upstream}_fresh")
    answered = answers[-1]
    assert answered.exit_code == 0 and answered.result == "fresh", answered.to_dict()


@pytest.mark.integration
def test_validate_says_why_an_upstream_has_no_tools(stack: Stack) -> None:
    """`toolworker validate` (the fleet's listings) names the never-listed upstream, why, and where its calls go."""
    validated = cli(stack, "validate")
    notice = [line for line in validated.stderr.splitlines() if "'later'" in line]
    assert notice and "connect" in notice[0].lower() and "later_*" in notice[0], validated.stderr


@pytest.mark.integration
def test_a_call_to_a_server_not_listed_yet_is_sent_to_it(stack: Stack, worker_client: ToolClient) -> None:
    """The server was down at its refresh (never listed); up now, `later_add` reaches its `add`, and a name it
    does not have is its own error (not 64, unknown to the fleet)."""
    listing = stack.listing("later")
    assert listing is not None and listing.listed_at is None, listing
    added = worker_client.call("later_add", {"a": 2, "b": 3}, timeout=60)
    assert added.exit_code == 0 and added.structured == {"total": 5}, added.to_dict()
    missing = worker_client.call("later_nothing", {}, timeout=60)
    assert missing.exit_code not in (0, 64) and "nothing" in str(missing.error), missing.to_dict()
    assert worker_client.call("elsewhere_add", {}, timeout=60).exit_code == 64


@pytest.mark.integration
def test_the_server_killed_and_restarted_while_calls_stream(stack: Stack, worker_client: ToolClient) -> None:
    """Calls stream through the worker while the server is killed (calls in flight on its session) and started
    again: every call gets one envelope, the failed ones a transport's code, and calls succeed again on a new
    session after the restart."""
    sdk = stack.servers["sdk"]
    results: list[list[ToolResult]] = []

    def stream() -> None:
        for batch in range(12):
            calls = [("sdk_slow", {"seconds": 0.05}) for _ in range(4)] + [("sdk_add", {"a": batch, "b": 1})]
            results.append(worker_client.call_many(calls, timeout=60))

    streaming = threading.Thread(target=stream)
    streaming.start()
    wait_until(lambda: len(results) >= 2, 60, "calls answered before the kill")
    sdk.kill()
    wait_until(lambda: len(results) >= 5 or not streaming.is_alive(), 60, "calls answered while the server is down")
    sdk.start()
    streaming.join(120)
    assert not streaming.is_alive()
    answered = [result for batch in results for result in batch]
    assert len(answered) == 12 * 5 and len({r.call_id for r in answered}) == 12 * 5
    codes = {r.exit_code for r in answered}
    assert codes <= {0, 7, 28, 52, 56} and codes - {0}, [(r.exit_code, r.error) for r in answered if r.exit_code]
    after = worker_client.call_many([("sdk_add", {"a": i, "b": 1}) for i in range(10)], timeout=60)
    assert [r.structured for r in after] == [{"total": i + 1} for i in range(10)], [r.to_dict() for r in after]


# --- the console --------------------------------------------------------------------------------

OPS_TOKEN = "ops-token-upstreams-4711"


@pytest.fixture(scope="module")
def gateway(stack: Stack, worker_client: ToolClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("gateway")
    access = folder / "access.yaml"
    access.write_text(f'tokens:\n  ops: {{token: "{OPS_TOKEN}", tools: ["*"], grants: [operate]}}\n')
    port = free_port()
    extra = {"TOOLWORKER_GATEWAY_ACCESS": str(access), "TOOLWORKER_GATEWAY_PUBLIC_URL": f"http://127.0.0.1:{port}"}
    env = gateway_env(stack.redis.url, stack.definitions, TOOLWORKER_STORE_POLL_SECONDS="0.5", **extra)
    started = start_gateway(env, folder / "gateway.log", port)
    wait_listening(started)
    yield started
    started.stop()


def upstream_rows(page: Page) -> dict[str, list[str]]:
    rows = page.locator("#upstreams tbody tr")
    cells = [[c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(rows.count())]
    return {row[0]: row for row in cells}


@pytest.mark.integration
def test_the_console_shows_upstreams_and_accepts_a_withheld_tool(
    stack: Stack, worker_client: ToolClient, gateway: Gateway, page: Page
) -> None:
    """The page lists each upstream (kind, protocol, tools, last refresh, unavailable, last error); a tool the
    pinned server grew waits with an Accept button; a form without the CSRF token changes nothing; the button
    serves it."""
    grown = worker_client.call("pinned_grow", {"name": "held"}, timeout=60)
    assert grown.exit_code == 0, grown.to_dict()
    wait_until(lambda: "held" in getattr(stack.listing("pinned"), "pending", {}), 30, "the grown tool withheld")
    page.goto(gateway.url + "/console/login")
    page.get_by_label("Token").fill(OPS_TOKEN)
    page.get_by_label("Token").press("Enter")
    page.wait_for_url("**/console/fleet")
    page.get_by_role("link", name="Upstreams").click()
    shown = upstream_rows(page)
    assert shown["grow"][1:3] == ["mcp", "2026-07-28"] and shown["oldgrow"][2].startswith("20"), shown
    assert int(shown["sdk"][3]) >= 5 and "UTC" in shown["sdk"][4] and shown["sdk"][6] == "available", shown
    assert shown["later"][6] == "unavailable" and "connect" in shown["later"][7].lower(), shown
    assert "pinned" in shown["pinned"][6], shown
    waiting = page.get_by_role("region", name="Withheld from pinned until accepted")
    assert "held" in waiting.inner_text() and "new" in waiting.inner_text()

    cookies = {cookie["name"]: cookie["value"] for cookie in page.context.cookies()}
    with httpx2.Client(base_url=gateway.url, cookies=cookies) as client:  # the session, not the form's token
        refused = client.post(
            "/console/upstreams/pinned/accept", data={"tool": "held"}, headers={"Origin": gateway.url}
        )
    still = stack.listing("pinned")
    assert refused.status_code == 403 and still is not None and "held" in still.pending

    waiting.get_by_role("button", name="Accept held").click()
    assert page.get_by_role("status").inner_text() == "Accepted the withheld tools of pinned."
    listing = stack.listing("pinned")
    assert listing is not None and "held" in listing.tools and not listing.pending
    assert page.get_by_role("region", name="Withheld from pinned until accepted").count() == 0
    audit = cli(stack, "audit").stdout
    assert "mcp_tool_accepted" in audit and "upstream.accept" in audit, audit[-2000:]


def in_thread(work: Coroutine[Any, Any, T]) -> T:
    """Run on a loop of its own in another thread (Playwright's sync API keeps a loop in this one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


async def gateway_call(gateway: Gateway, name: str, arguments: dict[str, object]) -> CallToolResult | MCPError:
    """The gateway's answer to the SDK's client, or the JSON-RPC error it answered with."""
    async with (
        httpx2.AsyncClient(headers=auth(OPS_TOKEN), timeout=60) as http,
        Client(streamable_http_client(gateway.url + "/mcp", http_client=http)) as client,
    ):
        try:
            return await client.call_tool(name, arguments)
        except MCPError as exc:
            return exc


@pytest.mark.integration
def test_through_the_gateway_a_server_not_listed_yet_gets_its_prefixs_calls(gateway: Gateway) -> None:
    """The SDK's client calls `later_add`, absent from `tools/list` (never listed), and the server answers it;
    a name of no upstream's prefix is an unknown tool."""
    added = in_thread(gateway_call(gateway, "later_add", {"a": 20, "b": 22}))
    assert isinstance(added, CallToolResult) and added.structured_content == {"total": 42}, added
    unknown = in_thread(gateway_call(gateway, "elsewhere_add", {}))
    assert isinstance(unknown, MCPError) and "elsewhere_add" in str(unknown), unknown
