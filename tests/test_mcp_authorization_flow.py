"""Authorization as the MCP specification's client, end to end: a protected MCP server (the `mcp` SDK's
`MCPServer` as a resource server) whose authorization server is oidc-provider, reached with no endpoint in the
upstream's `auth:`; and a server whose metadata points at a refused address, which is never connected to."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import redis.asyncio as aioredis
from redis import Redis

from tests.support.mcp_servers import McpServerProcess
from tests.support.oidc import OidcClient, OidcServer
from worker.call.connect import ConnectLinks
from worker.call.delegated import UserTokens
from worker.call.run import run_call
from worker.call.runtime import Runtime
from worker.call.vault import Keyring, Vault
from worker.definitions.mcp_tools import tool_of
from worker.definitions.model import Auth, McpServer, Source, ToolSet, Upstream
from worker.definitions.templates import Template
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.envelope import ToolResult
from worker.gateway.identity.delegation import Delegation
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport
from worker.protocol import ToolCall

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
SCOPE = "files.read"
FLEET = OidcClient("fleet", "fleet-secret", SCOPE, "acme")


def protected(port: int, issuer: str, seen: Path) -> McpServerProcess:
    argv = [sys.executable, "-m", "tests.support.mcp_protected_server", str(port), issuer, SCOPE]
    return McpServerProcess(argv, port, env={"MCP_PROTECTED_SEEN": str(seen)})


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("seen") / "tokens.jsonl"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, seen: Path) -> Iterator[tuple[McpServerProcess, OidcServer]]:
    """The protected server and its authorization server, which issues tokens for the server's URL."""
    port = free_port()
    oidc = OidcServer(tmp_path_factory.mktemp("oidc"), f"http://127.0.0.1:{port}/mcp", [FLEET]).start()
    server = protected(port, oidc.issuer, seen).start()
    yield server, oidc
    server.kill()
    oidc.stop()


@pytest.fixture(scope="module")
def refused_listener() -> Iterator[socket.socket]:
    """A socket on 127.0.0.2 that notices a connection, where a trap's metadata sends the client."""
    listener = socket.create_server(("127.0.0.2", 0))
    listener.setblocking(False)
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def trap(refused_listener: socket.socket, seen: Path) -> Iterator[McpServerProcess]:
    """A protected server whose Protected Resource Metadata names an authorization server on 127.0.0.2."""
    issuer = f"http://127.0.0.2:{refused_listener.getsockname()[1]}"
    server = protected(free_port(), issuer, seen).start()
    yield server
    server.kill()


def client_credentials_upstream(name: str, url: str) -> Upstream:
    auth = Auth(
        "oauth2_client_credentials",
        client_id=Template.literal(FLEET.client_id),
        client_secret=Template.parse("${env:FILES_SECRET}"),
        auth_method="basic",
    )
    return Upstream(name, Template.literal(url), auth=auth, mcp=McpServer(Template.literal(url)))


def call_whoami(upstream: Upstream, allow: str) -> ToolResult:
    tool = tool_of(upstream, "whoami", {"name": "whoami", "inputSchema": {"type": "object"}}, Source("<test>"))
    runtime = Runtime(ToolSet({upstream.name: upstream}, {tool.name: tool}), {"FILES_SECRET": FLEET.client_secret},
                      policy=EgressPolicy.parse(allow))  # fmt: skip

    async def run() -> ToolResult:
        try:
            return await run_call(ToolCall(call_id="c1", tool=tool.name, timeout_s=30), runtime)
        finally:
            await runtime.mcp.close()
            await runtime.transport.close()

    return asyncio.run(run())


def test_client_credentials_with_discovered_endpoints(files: tuple[McpServerProcess, OidcServer], seen: Path) -> None:
    """No token URL given: the 401 leads to the provider's token endpoint, the token is asked for the server as
    resource with the scope its metadata lists, and the server verifies it."""
    server, oidc = files
    result = call_whoami(client_credentials_upstream("files", server.url), f"127.0.0.1:{oidc.port}")
    assert result.exit_code == 0, result.to_dict()
    assert result.structured == {"subject": FLEET.client_id, "client": FLEET.client_id, "scopes": [SCOPE]}
    verified = [json.loads(line) for line in seen.read_text().splitlines()]
    assert {"sub": FLEET.client_id, "client_id": FLEET.client_id, "scopes": [SCOPE], "aud": server.url} in verified


def test_an_authorization_server_off_the_allow_list_is_77(files: tuple[McpServerProcess, OidcServer]) -> None:
    """The provider's origin not allowed: the call ends 77 naming it, before any token request."""
    server, oidc = files
    result = call_whoami(client_credentials_upstream("files", server.url), "")
    assert result.exit_code == 77, result.to_dict()
    assert oidc.issuer in result.error["message"]


def test_discovery_pointing_at_a_refused_address_never_connects(
    trap: McpServerProcess, refused_listener: socket.socket
) -> None:
    """Metadata naming 127.0.0.2 as the authorization server: 77 naming that origin, and nothing connects there."""
    result = call_whoami(client_credentials_upstream("trap", trap.url), "*")
    assert result.exit_code == 77, result.to_dict()
    port = refused_listener.getsockname()[1]
    assert f"http://127.0.0.2:{port}" in result.error["message"]
    with pytest.raises(BlockingIOError):
        refused_listener.accept()


def test_the_fleet_lists_a_protected_server_after_discovery(
    files: tuple[McpServerProcess, OidcServer], tmp_path: Path
) -> None:
    """`toolworker upstreams refresh` discovers, takes a token and lists the tools; the record is in Redis."""
    server, oidc = files
    (tmp_path / "files.yaml").write_text(
        "upstreams:\n"
        f"  files:\n    mcp: {{url: '{server.url}'}}\n"
        "    auth: {type: oauth2_client_credentials, client_id: fleet, client_secret: '${env:FILES_SECRET}', "
        "auth_method: basic}\n"
    )
    redis = EmbeddedRedis(tmp_path / "redis").start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
        env.update(TOOLWORKER_REDIS_URL=redis.url, TOOLWORKER_DEFINITIONS=str(tmp_path / "files.yaml"))
        env.update(TOOLWORKER_EGRESS_ALLOW=f"127.0.0.1:{oidc.port}", FILES_SECRET=FLEET.client_secret)
        argv = [sys.executable, "-m", "worker", "upstreams", "refresh", "files"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.splitlines()[-1])
        assert summary["error"] is None and summary["tools"] == 1, summary
        with Redis.from_url(redis.url) as client:
            keys = client.keys("toolworker:mcp:authorization:files:*")
            assert len(keys) == 1
            assert json.loads(client.get(keys[0]))["token_url"].startswith(oidc.issuer)
    finally:
        redis.stop()


def test_a_user_without_a_connection_gets_a_link_whose_authorization_is_discovered(
    files: tuple[McpServerProcess, OidcServer], tmp_path: Path
) -> None:
    """oauth2_user with only a pre-registered client_id: the call is 67 with a connect link, and the gateway's
    authorization URL goes to the discovered endpoint with PKCE S256, the server as resource and its scope."""
    server, oidc = files
    url = Template.literal(server.url)
    auth = Auth("oauth2_user", client_id=Template.literal("desk"))
    upstream = Upstream("files", url, auth=auth, mcp=McpServer(url))
    tool = tool_of(upstream, "whoami", {"name": "whoami", "inputSchema": {"type": "object"}}, Source("<test>"))
    redis = EmbeddedRedis(tmp_path / "redis").start()
    keyring = Keyring.parse("k1:" + base64.b64encode(b"k" * 32).decode())
    policy = EgressPolicy.parse(f"127.0.0.1:{oidc.port}")

    async def run() -> tuple[ToolResult, str]:
        client = aioredis.from_url(redis.url)
        links = ConnectLinks(client, keyring, "http://gateway.test", 300)
        users = UserTokens(client, keyring, links, 100)
        runtime = Runtime(ToolSet({"files": upstream}, {tool.name: tool}), {}, policy=policy, redis=client, users=users)
        delegation = Delegation(Vault(client, keyring), links, HttpTransport(policy), 100, {}, policy=policy)
        try:
            result = await run_call(ToolCall(call_id="c2", tool=tool.name, user="ann", timeout_s=30), runtime)
            location = await delegation.start("ann", upstream, "binding", time.time() + 300)
            return result, location
        finally:
            await runtime.mcp.close()
            await runtime.transport.close()
            await delegation.close()
            await client.aclose()

    try:
        result, location = asyncio.run(run())
    finally:
        redis.stop()
    assert result.exit_code == 67, result.to_dict()
    assert "http://gateway.test/v1/connections/files/authorize?ticket=" in result.error["message"]
    target = urlsplit(location)
    query = parse_qs(target.query)
    assert f"{target.scheme}://{target.netloc}" == oidc.issuer
    assert query["resource"] == [server.url] and query["code_challenge_method"] == ["S256"]
    assert query["client_id"] == ["desk"] and query["scope"][0].split()[0] == SCOPE
