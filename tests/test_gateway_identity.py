"""Identity at the gateway, end to end: a real authorization server (oidc-provider on loopback) issues
client-credentials access tokens; the gateway validates them, scopes every catalog to the principal's
grant, sends the principal and tenant with each call, and keeps one audit record per call."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
import redis
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp.shared.exceptions import MCPError

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import (
    DEFINITIONS,
    TOKEN,
    Gateway,
    Recorder,
    gateway_env,
    recording_upstream,
    start_gateway,
)
from tests.support.gateway_stack import wait_listening as wait_gateway
from tests.support.oidc import OidcClient, OidcServer, SigningKey
from tests.support.servers import DnsServer, ServerThread, UpstreamState
from tests.support.waiting import wait_until
from worker.constants import AUDIT_STREAM_KEY
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.queue import scheduler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ECHO = OidcClient("echo-agent", "echo-secret-0123456789abcdef", "tools.echo", "team-echo")
READER = OidcClient("reader", "reader-secret-0123456789abcdef", "tools.read", "team-read")
NOBODY = OidcClient("nobody", "nobody-secret-0123456789abcdef", "tools.other", "team-x")
CI_TOKEN = "ci-bot-static-token-0123456789"
ECHO_TOOLS = ["echo_delete", "echo_get", "echo_post", "echo_put", "held_echo"]
READ_TOOLS = ["echo_get", "whoami"]
ACCESS = """
tokens:
  ci-bot: {{token: "${{env:TEST_CI_BOT_TOKEN}}", tenant: ci, tags: [status]}}
oauth:
  issuer: {issuer}
  tenant_claim: tenant
  jwks_refetch_min_seconds: 0
  scopes:
    tools.echo: {{tags: [echo, held]}}
    tools.read: {{tags: [read]}}
"""


@dataclass
class IdentityStack:
    gateway: Gateway
    oidc: OidcServer
    redis_url: str
    worker_log: Path

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="module")
def identity_stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityStack]:
    """A Redis, a worker, the recording upstream, oidc-provider, and a gateway with an access file."""
    directory = tmp_path_factory.mktemp("identity")
    server = EmbeddedRedis(directory / "redis").start()
    upstream = ServerThread(recording_upstream(UpstreamState(), Recorder())).start()
    worker = start_worker(
        worker_env(server.url, upstream.url, dns_server.address, DEFINITIONS), directory / "worker.log"
    )
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    oidc, gateway = OidcServer(directory, public + "/mcp", [ECHO, READER, NOBODY]), None
    try:
        oidc.start()
        access = directory / "access.yaml"
        access.write_text(ACCESS.format(issuer=oidc.issuer))
        env = gateway_env(
            server.url,
            TOOLWORKER_GATEWAY_ACCESS=str(access),
            TOOLWORKER_GATEWAY_PUBLIC_URL=public,
            TEST_CI_BOT_TOKEN=CI_TOKEN,
        )
        gateway = start_gateway(env, directory / "gateway.log", port)
        wait_gateway(gateway, ready=True)
        yield IdentityStack(gateway, oidc, server.url, directory / "worker.log")
    finally:
        if gateway is not None:
            gateway.stop()
        oidc.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rest_call(stack: IdentityStack, token: str, tool: str, **arguments: Any) -> httpx2.Response:
    body = {"tool": tool, "arguments": arguments}
    return httpx2.post(stack.url + "/v1/calls", json=body, headers=bearer(token), timeout=60)


def challenge(answer: httpx2.Response) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer k="v", ...` header."""
    scheme, _, rest = answer.headers["www-authenticate"].partition(" ")
    assert scheme == "Bearer"
    pairs = (part.strip().split("=", 1) for part in rest.split('", '))
    return {key: value.strip('"') for key, value in pairs}


class MemoryTokens:
    """The MCP client's token storage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def oauth_http(stack: IdentityStack, client: OidcClient) -> httpx2.AsyncClient:
    """An HTTP client that gets its own access token the MCP way: the gateway's 401 names its Protected
    Resource Metadata, which names the authorization server, which issues a client-credentials token."""
    provider = ClientCredentialsOAuthProvider(
        server_url=stack.url + "/mcp",
        storage=MemoryTokens(),
        client_id=client.client_id,
        client_secret=client.client_secret,
        scope=client.scope,
        issuer=stack.oidc.issuer,
    )
    return httpx2.AsyncClient(auth=provider, timeout=30)


@asynccontextmanager
async def mcp_session(stack: IdentityStack, http: httpx2.AsyncClient, url: str | None = None) -> AsyncIterator[Client]:
    async with http, Client(streamable_http_client((url or stack.url) + "/mcp", http_client=http)) as client:
        yield client


async def all_tools(client: Client) -> list[str]:
    """Every page of tools/list (the gateway of these tests gives 4 tools a page)."""
    names, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        names += [tool.name for tool in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            return names


def text_of(result: Any) -> str:
    return str(result.content[0].text)


# --- discovery and the MCP client's own OAuth ------------------------------------------------------


def test_protected_resource_metadata_names_the_issuer(identity_stack: IdentityStack) -> None:
    """Both RFC 9728 paths answer without a token: the resource is the gateway's /mcp, the issuer its server."""
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        answer = httpx2.get(identity_stack.url + path, timeout=10)
        assert answer.status_code == 200, (path, answer.text)
        metadata = answer.json()
        assert metadata["resource"] == identity_stack.url + "/mcp"
        assert [s.rstrip("/") for s in metadata["authorization_servers"]] == [identity_stack.oidc.issuer]
        assert metadata["scopes_supported"] == ["tools.echo", "tools.read"]


def test_without_a_token_the_401_says_where_to_get_one(identity_stack: IdentityStack) -> None:
    """No token: 401 with `resource_metadata` pointing at the path-suffixed metadata, and no error code."""
    answer = httpx2.post(identity_stack.url + "/mcp", json={}, timeout=10)
    assert answer.status_code == 401
    params = challenge(answer)
    assert params["resource_metadata"] == identity_stack.url + "/.well-known/oauth-protected-resource/mcp"
    assert "error" not in params


async def test_an_mcp_client_authorizes_itself_and_calls_a_tool(identity_stack: IdentityStack) -> None:
    """The MCP SDK's client-credentials provider finds the issuer, gets a token and calls within its grant."""
    async with mcp_session(identity_stack, oauth_http(identity_stack, ECHO)) as client:
        assert await all_tools(client) == ECHO_TOOLS
        result = await client.call_tool("echo_get", {"item": "oauth-1"})
    assert not result.is_error and "oauth-1" in text_of(result)


# --- tokens the gateway refuses --------------------------------------------------------------------


def _tampered(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["scope"] = "tools.echo tools.read"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{header}.{forged}.{signature}"


def _hs256_with_public_key(stack: IdentityStack) -> str:
    """The classic confusion: HMAC keyed with the issuer's public key (PEM), which anyone can fetch.
    PyJWT refuses to sign with an asymmetric key as an HMAC secret, so the token is made by hand."""
    key = stack.oidc.keys[-1]
    public_pem = key.private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "HS256", "typ": "JWT", "kid": key.kid}
    return _signed_raw(header, stack.oidc.claims(ECHO), public_pem)


def _signed_raw(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    signing_input = f"{part(header)}.{part(claims)}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + base64.urlsafe_b64encode(signature).decode().rstrip("=")


def _alg_none(stack: IdentityStack) -> str:
    return jwt.encode(stack.oidc.claims(ECHO), key=None, algorithm="none", headers={"kid": stack.oidc.keys[-1].kid})


BAD_TOKENS = {
    "expired": lambda s: s.oidc.sign(s.oidc.claims(ECHO, exp=int(time.time()) - 600, iat=int(time.time()) - 900)),
    "wrong audience": lambda s: s.oidc.sign(s.oidc.claims(ECHO, aud="http://127.0.0.1:9/mcp")),
    "wrong issuer": lambda s: s.oidc.sign(s.oidc.claims(ECHO, iss="http://127.0.0.2:9")),
    "alg none": _alg_none,
    "HS256 keyed with the public key": _hs256_with_public_key,
    "unknown kid": lambda s: s.oidc.sign(s.oidc.claims(ECHO), key=SigningKey.new("not-published")),
    "tampered payload": lambda s: _tampered(s.oidc.token(ECHO)),
    "not a JWT": lambda s: "opaque-" + uuid.uuid4().hex,
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_a_bad_token_is_401_invalid_token(identity_stack: IdentityStack, case: str) -> None:
    """Each kind of bad token is refused on every surface with `error="invalid_token"` and the metadata URL."""
    token = BAD_TOKENS[case](identity_stack)
    for method, path in (("POST", "/mcp"), ("GET", "/v1/tools"), ("POST", "/toolserver/get_available_tools")):
        answer = httpx2.request(method, identity_stack.url + path, json={}, headers=bearer(token), timeout=10)
        assert answer.status_code == 401, (case, path, answer.text)
        params = challenge(answer)
        assert params["error"] == "invalid_token", (case, params)
        assert params["resource_metadata"].endswith("/.well-known/oauth-protected-resource/mcp")
        assert token not in answer.text


def test_a_token_the_server_signed_is_accepted(identity_stack: IdentityStack) -> None:
    """The control of the cases above: a token as the provider issues it passes."""
    answer = rest_call(identity_stack, identity_stack.oidc.token(ECHO), "echo_get", item="control")
    assert answer.status_code == 200 and answer.json()["exitCode"] == 0, answer.text


def test_a_valid_token_that_grants_no_tool_is_403_insufficient_scope(identity_stack: IdentityStack) -> None:
    """A real token whose scopes the access file maps to nothing: 403 with the scopes that would do."""
    answer = httpx2.get(identity_stack.url + "/v1/tools", headers=bearer(identity_stack.oidc.token(NOBODY)), timeout=10)
    assert answer.status_code == 403
    params = challenge(answer)
    assert params["error"] == "insufficient_scope" and params["scope"] == "tools.echo tools.read"


def test_a_key_rotation_at_the_server_is_followed_without_a_restart(identity_stack: IdentityStack) -> None:
    """The provider restarts signing with a new kid; the same gateway process accepts its tokens."""
    pid = identity_stack.gateway.process.pid
    new = identity_stack.oidc.rotate(f"key-{uuid.uuid4().hex[:6]}")
    token = identity_stack.oidc.token(ECHO)
    assert jwt.get_unverified_header(token)["kid"] == new.kid
    answer = rest_call(identity_stack, token, "echo_get", item="rotated")
    assert answer.status_code == 200 and answer.json()["exitCode"] == 0, answer.text
    assert identity_stack.gateway.process.pid == pid and identity_stack.gateway.process.poll() is None
    assert "gateway.jwks_fetched" in identity_stack.gateway.log_text()


# --- scoped catalogs -------------------------------------------------------------------------------


async def _mcp_names(stack: IdentityStack, token: str) -> list[str]:
    async with mcp_session(stack, httpx2.AsyncClient(headers=bearer(token), timeout=30)) as client:
        return await all_tools(client)


def _rest_names(stack: IdentityStack, token: str, **params: str) -> list[str]:
    answer = httpx2.get(stack.url + "/v1/tools", params=params, headers=bearer(token), timeout=10)
    assert answer.status_code == 200, answer.text
    return sorted(t.get("name") or t["function"]["name"] for t in answer.json()["tools"])


def _toolserver_names(stack: IdentityStack, token: str) -> list[str]:
    answer = httpx2.post(stack.url + "/toolserver/get_available_tools", headers=bearer(token), timeout=10)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert sorted(f["name"] for f in body["tools_json"]) == sorted(body["available_tools"])
    return sorted(body["available_tools"])


async def test_two_principals_see_their_own_catalogs(identity_stack: IdentityStack) -> None:
    """tools/list, the REST catalog and its exports, and ToolServer's listing hold only the granted tools."""
    for client, expected in ((ECHO, ECHO_TOOLS), (READER, READ_TOOLS)):
        token = identity_stack.oidc.token(client)
        assert await _mcp_names(identity_stack, token) == expected
        assert _rest_names(identity_stack, token) == expected
        assert _rest_names(identity_stack, token, format="openai") == expected
        assert _toolserver_names(identity_stack, token) == expected
    assert _rest_names(identity_stack, CI_TOKEN) == ["status"]
    assert len(_rest_names(identity_stack, TOKEN)) > len(ECHO_TOOLS)  # TOOLWORKER_GATEWAY_TOKENS: every tool


def test_search_and_retrieval_find_only_granted_tools(identity_stack: IdentityStack) -> None:
    """A question that matches tools of both grants finds, for the reader, only its own."""
    token = identity_stack.oidc.token(READER)
    found = httpx2.get(
        identity_stack.url + "/v1/tools/search", params={"question": "echo", "top_k": 20}, headers=bearer(token)
    )
    assert {row["name"] for row in found.json()["tools"]} <= set(READ_TOOLS)
    retrieved = httpx2.post(
        identity_stack.url + "/toolserver/retrieving_tools",
        json={"question": "echo", "top_k": 20},
        headers=bearer(token),
    )
    assert set(retrieved.json()["retrieved_tools"]) <= set(READ_TOOLS)
    schemas = httpx2.post(
        identity_stack.url + "/toolserver/get_json_schema_for_tools",
        json={"tools": ["echo_post", "whoami"]},
        headers=bearer(token),
    )
    assert schemas.json()["missing_tools"] == ["echo_post"]


async def test_another_principals_tool_is_answered_as_an_unknown_tool(identity_stack: IdentityStack) -> None:
    """The reader calling echo_post gets, on each surface, exactly the answer of a tool that does not exist."""
    token = identity_stack.oidc.token(READER)
    for name in ("echo_post", "no_such_tool"):
        rest = rest_call(identity_stack, token, name)
        assert (rest.status_code, rest.json()) == (
            404,
            {"error": {"type": "unknown_tool", "message": f"There is no tool named {name!r}."}},
        )
        schema = httpx2.get(f"{identity_stack.url}/v1/tools/{name}", headers=bearer(token))
        assert schema.status_code == 404
        body = {"tool_name": name, "arguments": {}}
        toolserver = httpx2.post(identity_stack.url + "/toolserver/execute_tool", json=body, headers=bearer(token))
        assert toolserver.status_code == 404 and name in toolserver.text
        async with mcp_session(identity_stack, httpx2.AsyncClient(headers=bearer(token), timeout=30)) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool(name, {"title": "x"})
        assert str(refused.value) == f"Unknown tool: {name}"


# --- identity on the call, and the audit trail -----------------------------------------------------


def _worker_events(stack: IdentityStack, call_id: str) -> list[dict[str, Any]]:
    events = []
    for line in stack.worker_log.read_text(errors="replace").splitlines():
        if call_id in line and line.startswith("{"):
            events.append(json.loads(line))
    return events


def _finished(stack: IdentityStack, call_id: str) -> dict[str, Any]:
    def found() -> list[dict[str, Any]]:
        return [e for e in _worker_events(stack, call_id) if e.get("event") == "call.finished"]

    # The worker writes its log line after it published the envelope.
    wait_until(found, what=f"the worker's call.finished for {call_id}")
    return found()[0]


def test_the_principal_and_tenant_reach_the_worker(identity_stack: IdentityStack) -> None:
    """The worker's record of each call names who made it: the token's `sub` and `tenant` claim, a named
    static token and its tenant, a legacy token as token-1 in the default tenant."""
    cases = [
        (identity_stack.oidc.token(ECHO), "echo_get", "echo-agent", "team-echo"),
        (CI_TOKEN, "status", "ci-bot", "ci"),
        (TOKEN, "echo_get", "token-1", "default"),
    ]
    for token, tool, principal, tenant in cases:
        arguments = {"item": "who"} if tool == "echo_get" else {"code": 200}
        answer = rest_call(identity_stack, token, tool, **arguments)
        assert answer.status_code == 200, answer.text
        finished = _finished(identity_stack, answer.json()["callId"])
        assert (finished["principal"], finished["tenant"]) == (principal, tenant)


def test_the_audit_trail_has_one_record_per_call_and_no_secret(identity_stack: IdentityStack) -> None:
    """Three calls, one record each (principal, tenant, tool, exitCode); neither the token nor an argument is
    in the stream, the logs, or the call message as Flower would show it; `toolworker audit` reads it back."""
    token = identity_stack.oidc.token(ECHO)
    marker = f"arg-{uuid.uuid4().hex}"
    call_ids = [rest_call(identity_stack, token, "echo_get", item=f"{marker}-{n}").json()["callId"] for n in range(3)]
    held = httpx2.post(
        identity_stack.url + "/v1/calls",
        json={"tool": "held_echo", "arguments": {"item": marker}, "wait": False},
        headers=bearer(token),
        timeout=30,
    )
    assert held.status_code == 202
    client = redis.Redis.from_url(identity_stack.redis_url)
    try:
        records = _records(client, [*call_ids, held.json()["callId"]])
        # The tenant's own list of the queue (fair share) is where the held call waits.
        queued = b"".join(client.lrange(scheduler.tenant_list("gateway-held", "team-echo"), 0, -1))
    finally:
        client.close()
    assert [r["callId"] for r in records] == [*call_ids, held.json()["callId"]]
    for record in records[:3]:
        assert (record["principal"], record["tenant"], record["tool"], record["exitCode"]) == (
            "echo-agent", "team-echo", "echo_get", "0",
        )  # fmt: skip
    assert records[3]["exitCode"] == "pending"
    assert b"echo-agent" in queued and token.encode() not in queued  # the held call's message, as Flower reads it
    for text in (json.dumps(records), identity_stack.gateway.log_text(), identity_stack.worker_log.read_text()):
        assert token not in text and marker not in text
    printed = _audit_cli(identity_stack, "--principal", "echo-agent")
    assert set(call_ids) <= {r["callId"] for r in printed} and {r["principal"] for r in printed} == {"echo-agent"}
    assert _audit_cli(identity_stack, "--since", "2999-01-01T00:00:00Z") == []


def _records(client: redis.Redis, call_ids: list[str]) -> list[dict[str, str]]:
    def mine() -> list[dict[str, str]]:
        entries = [{k.decode(): v.decode() for k, v in raw.items()} for _, raw in client.xrange(AUDIT_STREAM_KEY)]
        return [e for e in entries if e["callId"] in call_ids]

    # Written on the loop tick after the answer; more than one a call fails the caller's assertion.
    wait_until(lambda: len(mine()) >= len(call_ids), what="the calls' audit records")
    return mine()


def _audit_cli(stack: IdentityStack, *args: str) -> list[dict[str, str]]:
    env = {**stack.gateway.env}
    done = subprocess.run(
        [sys.executable, "-m", "worker", "audit", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_discovery_mode_shows_and_calls_only_granted_tools(identity_stack: IdentityStack) -> None:
    """In discovery mode the reader's meta-tools list, describe and call only its own tools."""
    log = identity_stack.gateway.log_path.with_name("gateway-discovery.log")
    discovery = start_gateway(identity_stack.gateway.env, log, None, "--mode", "discovery")
    token = identity_stack.oidc.token(READER)
    try:
        async with mcp_session(
            identity_stack, httpx2.AsyncClient(headers=bearer(token), timeout=30), discovery.url
        ) as client:
            listed = json.loads(text_of(await client.call_tool("list_tools", {})))
            schemas = json.loads(text_of(await client.call_tool("get_tool_schema", {"names": ["echo_post", "whoami"]})))
            with pytest.raises(MCPError) as refused:
                await client.call_tool("call_tool", {"name": "echo_post", "arguments": {"title": "x"}})
    finally:
        discovery.stop()
    assert sorted(row["name"] for row in listed["tools"]) == READ_TOOLS and listed["tags"] == {"echo": 1, "read": 2}
    assert [tool["name"] for tool in schemas["tools"]] == ["whoami"] and schemas["missing"] == ["echo_post"]
    assert str(refused.value) == "Unknown tool: echo_post"
