"""An MCP upstream whose server wants a user's token even to list its tools (`auth: oauth2_user`): listed with the
token of the first user who connects it, and refreshed then. A protected MCP server (the `mcp` SDK's `MCPServer`
as a resource server, tests/support/mcp_protected_server.py; every request, `tools/list` too, needs a token)
behind oidc-provider taking dynamic registrations; the gateway (a process) serves the connect link, the callback
and the REST listing, and starts the refresh; the worker's side of a call runs in this process (`run_call`). A
scripted browser follows the link through oidc-provider's login and consent."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis.asyncio as aioredis
from redis import Redis

from tests.support.gateway_stack import Gateway, auth, gateway_env, start_gateway
from tests.support.mcp_servers import McpServerProcess
from tests.support.oidc import OidcServer, consent
from tests.support.vault_stack import link_in
from tests.support.waiting import wait_until
from worker.call.connect import ConnectLinks
from worker.call.delegated import UserTokens
from worker.call.run import run_call
from worker.call.runtime import Runtime
from worker.call.vault import LISTER_KEY_PREFIX, Keyring, Vault
from worker.definitions.file_store import load
from worker.definitions.mcp_tools import with_listings
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.envelope import ToolResult
from worker.http.egress import EgressPolicy
from worker.protocol import ToolCall

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
VAULT_KEY = "k1:" + base64.b64encode(b"f" * 32).decode()
READ = "files.read"
DEFINITIONS = """
upstreams:
  files:
    mcp: {{url: '{url}'}}
    auth: {{type: oauth2_user}}
"""


@dataclass
class Stack:
    redis: EmbeddedRedis
    gateway: Gateway
    definitions: Path
    env: dict[str, str]
    seen: Path  # the protected server's record of the tokens it verified


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("first-user")
    redis = EmbeddedRedis(directory / "redis").start()
    gateway_port, port = free_port(), free_port()
    public, url = f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{port}/mcp"
    oidc = OidcServer(
        (directory / "oidc").resolve(),
        url,
        [],
        extra={"registration": True, "upstream": {"resource": url, "scope": READ}},
    )
    oidc.directory.mkdir()
    seen = directory / "seen.jsonl"
    argv = [sys.executable, "-m", "tests.support.mcp_protected_server", str(port), oidc.issuer, READ]
    started: list[McpServerProcess | OidcServer] = []
    gateway = None
    try:
        started.append(oidc.start())
        started.append(McpServerProcess(argv, port, {"MCP_PROTECTED_SEEN": str(seen)}).start())
        definitions = directory / "definitions.yaml"
        definitions.write_text(DEFINITIONS.format(url=url))
        env = dict(
            TOOLWORKER_VAULT_KEYS=VAULT_KEY,
            TOOLWORKER_GATEWAY_PUBLIC_URL=public,
            TOOLWORKER_EGRESS_ALLOW=f"127.0.0.1:{oidc.port}",
        )
        gateway = start_gateway(gateway_env(redis.url, definitions, **env), directory / "gateway.log", gateway_port)
        yield Stack(redis, gateway, definitions, env, seen)
    finally:
        if gateway is not None:
            gateway.stop()
        for process in reversed(started):
            process.kill() if isinstance(process, McpServerProcess) else process.stop()
        redis.stop()


def call(stack: Stack, name: str, user: str) -> ToolResult:
    """A call of `name` as a worker runs it for `user`, with the definitions as loaded and nothing listed."""
    toolset = with_listings(load([stack.definitions], stack.env), {})
    keyring = Keyring.parse(VAULT_KEY)
    policy = EgressPolicy.parse(stack.env["TOOLWORKER_EGRESS_ALLOW"])

    async def run() -> ToolResult:
        client = aioredis.from_url(stack.redis.url)
        users = UserTokens(client, keyring, ConnectLinks(client, keyring, stack.gateway.url, 600), 100)
        runtime = Runtime(toolset, stack.env, policy=policy, redis=client, users=users)
        try:
            return await run_call(ToolCall(call_id=uuid.uuid4().hex, tool=name, user=user, timeout_s=30), runtime)
        finally:
            await runtime.mcp.close()
            await runtime.transport.close()
            await client.aclose()

    return asyncio.run(run())


def connect(stack: Stack, user: str) -> None:
    refused = call(stack, "files_whoami", user)
    assert refused.exit_code == 67, refused.to_dict()
    _, page = consent(link_in(refused.error["message"]), user)
    assert page.status_code == 200 and "Connected files." in page.text, page.text[:500]


def row(stack: Stack) -> dict[str, Any]:
    listed = httpx2.get(f"{stack.gateway.url}/v1/upstreams", headers=auth(), timeout=30).json()["upstreams"]
    (found,) = [r for r in listed if r["name"] == "files"]
    return dict(found)


def lister(stack: Stack) -> bytes | None:
    with Redis.from_url(stack.redis.url) as client:
        return client.get(LISTER_KEY_PREFIX + "files")


def connected(stack: Stack) -> list[tuple[str, bool]]:
    """The users the gateway noted connecting the upstream, in order, and whether each became its lister."""
    lines = [json.loads(line) for line in stack.gateway.log_text().splitlines() if "mcp.user_connected" in line]
    return [(line["principal"], line["lists"]) for line in lines]


def refreshed(stack: Stack) -> dict[str, Any]:
    answer = httpx2.post(f"{stack.gateway.url}/v1/upstreams/files/refresh", headers=auth(), timeout=60)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_the_first_user_who_connects_lists_the_upstream(stack: Stack) -> None:
    """Before anyone connects, a refresh fails (no user to list it as) and a call of prefix + a name reaches the
    server, which wants the user's token (67, with a link); once the user consents, the upstream is listed
    with their token without any manual refresh; a second user does not take over; and once the first user's
    connection is removed, a refresh fails again until someone connects."""
    before = refreshed(stack)
    assert before["available"] is False and "no user has connected it yet" in before["error"], before
    assert row(stack)["tools"] == 0
    connect(stack, "ann")
    wait_until(lambda: connected(stack) == [("ann", True)], 30, "the gateway's note of the first connection")
    assert lister(stack) == b"ann"
    # The listing stored, then the gateway's catalog serving its tool (the row counts the catalog's tools).
    wait_until(lambda: row(stack)["tools"] == 1, 60, "the upstream's tool, after the first user connected")
    listed = row(stack)
    assert listed["available"] is True and listed["error"] is None and listed["listedAt"], listed
    subjects = [json.loads(line).get("sub") for line in stack.seen.read_text().splitlines()]
    assert "ann" in subjects
    connect(stack, "bob")
    wait_until(lambda: len(connected(stack)) == 2, 30, "the gateway's note of the second connection")
    assert connected(stack) == [("ann", True), ("bob", False)] and lister(stack) == b"ann"
    bobs = call(stack, "files_whoami", "bob")
    assert bobs.exit_code == 0 and bobs.structured is not None and bobs.structured["subject"] == "bob", bobs.to_dict()

    async def disconnect() -> None:
        client = aioredis.from_url(stack.redis.url)
        try:
            assert await Vault(client, Keyring.parse(VAULT_KEY)).delete("ann", "files")
        finally:
            await client.aclose()

    asyncio.run(disconnect())
    assert lister(stack) is None
    after = refreshed(stack)
    assert after["available"] is False and "no user has connected it yet" in after["error"], after
    assert after["tools"] == 1  # the tools listed before keep being served
