"""The fleet's client identity at MCP servers' authorization servers and the step-up of a 403, at their seams:
the registration request and its answer (worker/mcp_client/authorization.py), registrations kept in Redis with
their secrets sealed (worker/call/mcp_clients.py), the client an upstream's auth then names, and what a 403
`insufficient_scope` ends a call with (worker/call/mcp_authorization.py)."""

from __future__ import annotations

import base64
import json
import re
import time

import fakeredis
import pytest

from worker import errors
from worker.call.connect import ConnectLinks
from worker.call.delegated import Client, UserTokens
from worker.call.mcp_authorization import step_up, with_client
from worker.call.mcp_clients import Registrations, document_url, forget_registrations, metadata_document
from worker.call.vault import Keyring, TokenSet
from worker.definitions.model import Auth, McpServer, Upstream
from worker.definitions.readers.upstreams import AuthModel, build_auth
from worker.definitions.templates import Template
from worker.gateway.identity.security import is_open_path
from worker.http import delegated as http_delegated
from worker.http.egress import EgressPolicy
from worker.http.oauth import TokenRequest
from worker.http.transport import HttpTransport, Response
from worker.mcp_client.authorization import Challenge, Guard, Registered, register
from worker.mcp_client.challenges import Challenged

SERVER = "https://mcp.example.com/mcp"
REGISTER = "https://auth.example.com/register"
KEYRING = Keyring.parse("k1:" + base64.b64encode(b"r" * 32).decode())
SECRET = "registered-secret-0123456789"


class Registrar:
    """A post that answers a registration request, remembering what it was sent."""

    def __init__(self, status: int, answer: dict[str, object]) -> None:
        self.status, self.answer = status, answer
        self.sent: list[tuple[str, dict[str, object]]] = []

    async def __call__(self, url: str, body: bytes) -> tuple[int, bytes]:
        self.sent.append((url, json.loads(body)))
        return self.status, json.dumps(self.answer).encode()


def guard(allow: str = "auth.example.com") -> Guard:
    return Guard(EgressPolicy.parse(allow), SERVER, "files")


async def test_registration_asks_for_a_confidential_code_flow_client_and_reads_the_answer() -> None:
    post = Registrar(
        201, {"client_id": "c-1", "client_secret": SECRET, "token_endpoint_auth_method": "client_secret_basic"}
    )
    registered = await register(post, guard(), REGISTER, "toolworker (files)", "https://gw/v1/connections/callback")
    assert registered == Registered("c-1", SECRET, "basic", 0.0)
    assert SECRET not in repr(registered)
    assert post.sent == [
        (
            REGISTER,
            {
                "client_name": "toolworker (files)",
                "redirect_uris": ["https://gw/v1/connections/callback"],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "client_secret_post",
            },
        )
    ]
    public = await register(
        Registrar(201, {"client_id": "c-2", "token_endpoint_auth_method": "none"}), guard(), REGISTER, "n", "r"
    )
    assert public == Registered("c-2", None, "body", 0.0)


async def test_a_refused_registration_is_78_and_a_refused_origin_is_77_with_nothing_sent() -> None:
    with pytest.raises(errors.ToolMisconfigured, match=r"refused to register .*\(invalid_client_metadata\)"):
        await register(Registrar(400, {"error": "invalid_client_metadata"}), guard(), REGISTER, "n", "r")
    post = Registrar(201, {"client_id": "never"})
    with pytest.raises(errors.EgressBlocked, match=re.escape("https://auth.example.com")):
        await register(post, guard(allow="other.example.com"), REGISTER, "n", "r")
    assert post.sent == []


async def test_a_registration_is_kept_with_its_secret_sealed_and_the_first_kept_wins() -> None:
    redis = fakeredis.aioredis.FakeRedis()
    key = Registrations.key("files", "https://auth.example.com", "https://gw/v1/connections/callback")
    kept = await Registrations(redis, KEYRING).keep(key, Registered("c-1", SECRET, "body"))
    record = json.loads(await redis.get(key))
    assert record["client_id"] == "c-1" and SECRET not in json.dumps(record)
    assert KEYRING.open(record["secret"], key) == SECRET.encode()
    assert KEYRING.open(record["secret"], key + "x") is None  # bound to its own key
    other = Registrations(redis, KEYRING)  # another process, which registered too
    assert await other.keep(key, Registered("c-2", "other-secret")) == kept
    assert await other.get(key) == Registered("c-1", SECRET, "body")
    await forget_registrations(redis, "files")
    assert await other.get(key) is None and await redis.get(key) is None


async def test_a_registration_no_key_opens_or_whose_secret_expires_is_registered_again() -> None:
    redis = fakeredis.aioredis.FakeRedis()
    key = Registrations.key("files", "i", "r")
    await Registrations(redis, Keyring.parse("old:" + base64.b64encode(b"o" * 32).decode())).keep(
        key, Registered("c-old", SECRET)
    )
    registrations = Registrations(redis, KEYRING)
    assert await registrations.get(key) is None
    assert await registrations.keep(key, Registered("c-new", "new-secret")) == Registered("c-new", "new-secret")
    assert (await registrations.get(key) or Registered("")).client_id == "c-new"
    soon = Registered("c-soon", SECRET, "body", time.time() + 5)
    await forget_registrations(redis, "files")
    await registrations.keep(key, soon)
    assert await registrations.get(key) is None  # within the margin before its expiry


def test_the_auth_names_the_client_and_never_shows_the_secret() -> None:
    auth = Auth("oauth2_user")
    registered = with_client(auth, "", Registered("c-1", SECRET, "basic"))
    assert SECRET not in repr(registered)
    client = Client.of(registered, {})
    assert (client.client_id, client.client_secret, client.method) == ("c-1", SECRET, "basic")
    documented = Client.of(with_client(auth, "https://gw/v1/connections/clients/files.json"), {})
    assert (documented.client_id, documented.client_secret) == ("https://gw/v1/connections/clients/files.json", None)
    with pytest.raises(errors.ToolMisconfigured, match="names no client_id"):
        Client.of(auth, {})


def test_the_metadata_document_names_itself_and_the_gateways_callback() -> None:
    url = document_url("https://gw.example/", "my files")
    assert url == "https://gw.example/v1/connections/clients/my%20files.json"
    document = metadata_document("https://gw.example", "my files")
    assert document["client_id"] == url and document["redirect_uris"] == ["https://gw.example/v1/connections/callback"]
    assert document["token_endpoint_auth_method"] == "none"
    assert is_open_path("/v1/connections/clients/files.json")
    assert not is_open_path("/v1/connections/clients/.json") and not is_open_path("/v1/connections/clients/x")


def user_upstream(scopes: tuple[str, ...] = ()) -> Upstream:
    url = Template.literal(SERVER)
    auth = Auth("oauth2_user", client_id=Template.literal("c"), scopes=scopes)
    return Upstream("files", url, auth=auth, mcp=McpServer(url))


def refused(scope: str | None, status: int = 403, error: str = "insufficient_scope") -> Challenged:
    return Challenged("files", status, Challenge(scope=scope, error=error))


async def users_with(tokens: TokenSet | None) -> UserTokens:
    redis = fakeredis.aioredis.FakeRedis()
    users = UserTokens(redis, KEYRING, ConnectLinks(redis, KEYRING, "https://gw", 600), 100)
    if tokens is not None:
        assert users.vault is not None
        await users.vault.put("ann", "files", tokens)
    return users


async def test_a_step_up_links_to_a_consent_for_the_union_of_scopes() -> None:
    """Held (and asked before, e.g. offline_access) plus what the 403 asks: the link's ticket carries them."""
    users = await users_with(TokenSet("t", scopes=("files.read",), asked=("files.read", "offline_access")))
    failure = await step_up(users, "ann", user_upstream(), refused("files.read files.write"))
    assert isinstance(failure, errors.AuthorizationRequired) and "is not enough" in failure.message
    ticket = failure.message.rsplit("ticket=", 1)[1]
    assert users.links is not None
    redeemed = await users.links.redeem(ticket, "files")
    assert redeemed is not None and redeemed[2] == ("files.read", "offline_access", "files.write")


async def test_a_step_up_the_grant_already_covers_is_an_error_without_a_link() -> None:
    """The token holds the scopes, or the user's last consent asked for them: a new consent would loop."""
    for tokens, asked in (
        (TokenSet("t", scopes=("files.read", "files.write")), "files.write"),
        (TokenSet("t", scopes=("files.read",), asked=("files.read", "files.admin")), "files.read files.admin"),
    ):
        failure = await step_up(await users_with(tokens), "ann", user_upstream(), refused(asked))
        assert failure.exit_code == 67 and "ticket=" not in failure.message, failure.message
        assert "a new consent would not change that" in failure.message


async def test_a_fleet_credential_or_another_refusal_gets_no_link() -> None:
    users = await users_with(None)
    url = Template.literal(SERVER)
    fleet = Upstream("files", url, auth=Auth("oauth2_client_credentials"), mcp=McpServer(url))
    failure = await step_up(users, None, fleet, refused("files.write"))
    assert failure.exit_code == 67 and "does not carry" in failure.message and "ticket=" not in failure.message
    unnamed = await step_up(users, "ann", user_upstream(), refused(None))
    assert unnamed.exit_code == 67 and "does not name" in unnamed.message and "ticket=" not in unnamed.message
    unauthorized = refused(None, 401, "invalid_token")
    assert await step_up(users, "ann", user_upstream(), unauthorized) is unauthorized


async def test_invalid_client_at_the_token_endpoint_forgets_the_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server no longer knows the registered client: the refresh is refused as `ClientRejected`, the
    registration is dropped (the next link registers anew) and the user gets a new link."""

    async def answered(transport: object, request: TokenRequest) -> Response:
        assert request.form["resource"] == SERVER  # RFC 8707 on the refresh too
        body = b'{"error": "invalid_client"}'
        return Response(401, "Unauthorized", "application/json", None, body, True, request.url)

    monkeypatch.setattr(http_delegated, "post_form", answered)
    tokens = TokenSet("t", refresh_token="r", expires_at=time.time() - 1, obtained_at=time.time() - 100)
    users = await users_with(tokens)
    assert users.vault is not None
    key = Registrations.key("files", "i", "r")
    await Registrations(users.vault.redis, KEYRING).keep(key, Registered("c-1", SECRET))
    url = Template.literal(SERVER)
    auth = Auth(
        "oauth2_user",
        client_id=Template.literal("c-1"),
        authorization_url=Template.literal("https://auth.example.com/authorize"),
        token_url=Template.literal("https://auth.example.com/token"),
        extra_params={"resource": url},
    )
    upstream = Upstream("files", url, auth=auth, mcp=McpServer(url))
    with pytest.raises(errors.AuthorizationRequired, match="ticket="):
        await users.token("ann", upstream, {}, HttpTransport(EgressPolicy.parse("")), time.time() + 10, None)
    assert await users.vault.redis.get(key) is None and await users.vault.get("ann", "files") is None


def test_an_mcp_user_upstream_leaves_its_client_out_only_when_discovery_finds_its_server() -> None:
    assert build_auth("files", AuthModel(type="oauth2_user"), mcp=True).client_id is None
    with pytest.raises(ValueError, match="needs client_id"):
        build_auth("files", AuthModel(type="oauth2_user", issuer="https://auth.example.com"), mcp=True)
    with pytest.raises(ValueError, match="needs client_id"):
        build_auth("api", AuthModel(type="oauth2_user", issuer="https://auth.example.com"))
