"""The fleet's client at an MCP server's authorization server, end to end, and the step-up of a 403: protected MCP
servers (the `mcp` SDK's `MCPServer` as a resource server, tests/support/mcp_protected_server.py) whose
authorization servers are oidc-provider, one taking RFC 7591 dynamic registrations (and a pre-registered
client), the other Client ID Metadata Documents; the gateway (a process) serves the connect links, the
callback and the metadata documents; the worker's side runs in this process (`run_call`). A scripted browser
follows each link through oidc-provider's login and consent."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest
import redis.asyncio as aioredis
from redis import Redis

from tests.support import redis_scan
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway
from tests.support.mcp_servers import McpServerProcess
from tests.support.oidc import OidcServer, consent
from tests.support.vault_stack import link_in
from worker.call.connect import ConnectLinks
from worker.call.delegated import UserTokens
from worker.call.mcp_clients import CLIENT_KEY_PREFIX
from worker.call.run import run_call
from worker.call.runtime import Runtime
from worker.call.vault import Keyring
from worker.definitions.file_store import load
from worker.definitions.mcp_tools import tool_of
from worker.definitions.model import Source, ToolSet
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.envelope import ToolResult
from worker.http.egress import EgressPolicy
from worker.protocol import ToolCall

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
VAULT_KEY = "k1:" + base64.b64encode(b"m" * 32).decode()
DESK_SECRET = "desk-secret-0123456789abcdef"
READ, WRITE, ADMIN = "files.read", "files.write", "files.admin"
DEFINITIONS = """
upstreams:
  files:
    mcp: {{url: '{registering}'}}
    auth: {{type: oauth2_user}}
  desk:
    mcp: {{url: '{registering}'}}
    auth: {{type: oauth2_user, client_id: desk, client_secret: '${{env:DESK_SECRET}}'}}
  docs:
    mcp: {{url: '{documents}'}}
    auth: {{type: oauth2_user}}
"""


@dataclass
class Stack:
    redis: EmbeddedRedis
    registering: OidcServer  # dynamic registration (and the pre-registered `desk`)
    documents: OidcServer  # Client ID Metadata Documents
    gateway: Gateway
    definitions: Path
    env: dict[str, str]

    @property
    def public(self) -> str:
        return self.gateway.url


def protected(port: int, issuer: str, *tool_scopes: str) -> McpServerProcess:
    argv = [sys.executable, "-m", "tests.support.mcp_protected_server", str(port), issuer, READ, *tool_scopes]
    return McpServerProcess(argv, port)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("clients")
    redis = EmbeddedRedis(directory / "redis").start()
    gateway_port, port_a, port_b = free_port(), free_port(), free_port()
    public = f"http://127.0.0.1:{gateway_port}"
    url_a, url_b = f"http://127.0.0.1:{port_a}/mcp", f"http://127.0.0.1:{port_b}/mcp"
    desk = {"client_id": "desk", "client_secret": DESK_SECRET, "redirect_uris": [public + "/v1/connections/callback"]}
    registering = OidcServer(
        (directory / "a").resolve(),
        url_a,
        [],
        extra={
            "registration": True,
            "upstream": {"resource": url_a, "scope": f"{READ} {WRITE}"},
            "userClients": [desk],
        },
    )
    documents = OidcServer(
        (directory / "b").resolve(),
        url_b,
        [],
        extra={"metadataDocuments": True, "upstream": {"resource": url_b, "scope": READ}},
    )
    for oidc in (registering, documents):
        oidc.directory.mkdir()
    started: list[McpServerProcess | OidcServer] = []
    gateway = None
    try:
        started += [registering.start(), documents.start()]
        started.append(protected(port_a, registering.issuer, f"write={WRITE}", f"admin={ADMIN}").start())
        started.append(protected(port_b, documents.issuer).start())
        definitions = directory / "definitions.yaml"
        definitions.write_text(DEFINITIONS.format(registering=url_a, documents=url_b))
        env = dict(
            TOOLWORKER_VAULT_KEYS=VAULT_KEY,
            TOOLWORKER_GATEWAY_PUBLIC_URL=public,
            TOOLWORKER_EGRESS_ALLOW=f"127.0.0.1:{registering.port},127.0.0.1:{documents.port}",
            DESK_SECRET=DESK_SECRET,
        )
        gateway = start_gateway(gateway_env(redis.url, definitions, **env), directory / "gateway.log", gateway_port)
        yield Stack(redis, registering, documents, gateway, definitions, env)
    finally:
        if gateway is not None:
            gateway.stop()
        for process in reversed(started):
            process.kill() if isinstance(process, McpServerProcess) else process.stop()
        redis.stop()


def call(stack: Stack, upstream_name: str, tool_name: str, user: str) -> ToolResult:
    """One call of a tool of the upstream as a worker runs it, for `user`."""
    upstream = load([stack.definitions], stack.env).upstreams[upstream_name]
    tool = tool_of(upstream, tool_name, {"name": tool_name, "inputSchema": {"type": "object"}}, Source("<test>"))
    keyring = Keyring.parse(VAULT_KEY)
    policy = EgressPolicy.parse(stack.env["TOOLWORKER_EGRESS_ALLOW"])

    async def run() -> ToolResult:
        client = aioredis.from_url(stack.redis.url)
        users = UserTokens(client, keyring, ConnectLinks(client, keyring, stack.public, 600), 100)
        toolset = ToolSet({upstream.name: upstream}, {tool.name: tool})
        runtime = Runtime(toolset, stack.env, policy=policy, redis=client, users=users)
        try:
            return await run_call(ToolCall(call_id=uuid.uuid4().hex, tool=tool.name, user=user, timeout_s=30), runtime)
        finally:
            await runtime.mcp.close()
            await runtime.transport.close()
            await client.aclose()

    return asyncio.run(run())


def connected(stack: Stack, upstream: str, user: str) -> dict[str, list[str]]:
    """The user connected through the 67's link; the query of the authorization request."""
    refused = call(stack, upstream, "whoami", user)
    assert refused.exit_code == 67, refused.to_dict()
    authorize, page = consent(link_in(refused.error["message"]), user)
    assert page.status_code == 200 and f"Connected {upstream}." in page.text, page.text[:500]
    return authorize


def registrations(stack: Stack, upstream: str) -> list[dict[str, object]]:
    with Redis.from_url(stack.redis.url) as client:
        return [json.loads(client.get(key) or b"{}") for key in client.keys(f"{CLIENT_KEY_PREFIX}{upstream}:*")]


def test_a_registered_client_connects_a_user_and_its_secret_is_sealed(
    stack: Stack, capfd: pytest.CaptureFixture[str]
) -> None:
    """No client_id: the fleet registers at the server's registration endpoint, keeps the registration in Redis
    (the secret sealed: its plaintext is nowhere in Redis nor in the gateway's or the worker's log), and the
    gateway's flow uses that same client; the call then succeeds with the user's token, issued to that client
    for the server."""
    authorize = connected(stack, "files", "ann")
    (record,) = registrations(stack, "files")
    assert authorize["client_id"] == [record["client_id"]]
    assert authorize["resource"] == [f"http://127.0.0.1:{urlsplit(authorize['resource'][0]).port}/mcp"]
    assert authorize["scope"] == [f"{READ} offline_access"] and authorize["code_challenge_method"] == ["S256"]
    result = call(stack, "files", "whoami", "ann")
    assert result.exit_code == 0, result.to_dict()
    assert result.structured == {"subject": "ann", "client": record["client_id"], "scopes": [READ]}
    sealed = record["secret"]
    assert isinstance(sealed, str) and set(json.loads(sealed)) == {"kid", "nonce", "data"}
    context = next(iter(Redis.from_url(stack.redis.url).keys(f"{CLIENT_KEY_PREFIX}files:*"))).decode()
    opened = Keyring.parse(VAULT_KEY).open(sealed, context)
    assert opened is not None and len(opened) >= 16
    secret = opened.decode()
    with Redis.from_url(stack.redis.url) as client:
        assert [key for key, value in redis_scan.values(client) if secret.encode() in value] == []
    assert secret not in stack.gateway.log_text()
    assert secret not in "".join(capfd.readouterr())  # the worker's side, in this process
    connected(stack, "files", "bob")  # a later flow reuses the registration: the server registered one client
    assert call(stack, "files", "whoami", "bob").structured == {
        "subject": "bob",
        "client": record["client_id"],
        "scopes": [READ],
    }
    assert re.findall(r"registered (\S+)", (stack.registering.directory / "oidc.log").read_text()) == [
        record["client_id"]
    ]


def test_a_pre_registered_client_is_used_as_given(stack: Stack) -> None:
    """A client_id in `auth:`: no registration, the flow and the token are that client's."""
    authorize = connected(stack, "desk", "cat")
    assert authorize["client_id"] == ["desk"]
    result = call(stack, "desk", "whoami", "cat")
    assert result.exit_code == 0, result.to_dict()
    assert result.structured == {"subject": "cat", "client": "desk", "scopes": [READ]}
    assert registrations(stack, "desk") == []


def test_a_client_id_metadata_document_names_the_client(stack: Stack) -> None:
    """The server advertises Client ID Metadata Documents: the client_id is the document's URL at the gateway,
    which serves it (public, no token); the server fetches it, and the flow and the call go through."""
    url = f"{stack.public}/v1/connections/clients/docs.json"
    document = httpx2.get(url, timeout=10)
    assert document.status_code == 200, document.text
    assert document.json() == {
        "client_id": url,
        "client_name": "toolworker (docs)",
        "redirect_uris": [f"{stack.public}/v1/connections/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }
    for other in ("desk", "nowhere"):  # a pre-registered client, an unknown upstream
        assert httpx2.get(f"{stack.public}/v1/connections/clients/{other}.json", timeout=10).status_code == 404
    authorize = connected(stack, "docs", "dan")
    assert authorize["client_id"] == [url]
    result = call(stack, "docs", "whoami", "dan")
    assert result.exit_code == 0, result.to_dict()
    assert result.structured == {"subject": "dan", "client": url, "scopes": [READ]}
    assert f"document {url} 200" in (stack.documents.directory / "oidc.log").read_text()
    assert registrations(stack, "docs") == []


def test_a_403_insufficient_scope_asks_once_for_the_union_of_scopes(stack: Stack) -> None:
    """A tool needing a scope the user's grant lacks: 67 with a new link asking for what the grant holds and
    what the server asks; after consent the call goes through. A scope the server asks for again after the
    user's consent asked for it (the authorization server never grants it) is an error without a link."""
    connected(stack, "files", "eve")
    stepped = call(stack, "files", "write", "eve")
    assert stepped.exit_code == 67, stepped.to_dict()
    authorize, page = consent(link_in(stepped.error["message"]), "eve")
    assert page.status_code == 200, page.text[:500]
    assert set(authorize["scope"][0].split()) == {READ, "offline_access", WRITE}
    result = call(stack, "files", "write", "eve")
    assert result.exit_code == 0, result.to_dict()
    assert result.structured is not None and set(result.structured["scopes"]) == {READ, WRITE}
    beyond = call(stack, "files", "admin", "eve")
    assert beyond.exit_code == 67, beyond.to_dict()
    authorize, page = consent(link_in(beyond.error["message"]), "eve")
    assert ADMIN in authorize["scope"][0].split() and page.status_code == 200
    again = call(stack, "files", "admin", "eve")
    assert again.exit_code == 67 and "authorize?ticket=" not in again.error["message"], again.to_dict()
    assert "a new consent would not change that" in again.error["message"]
