"""The authorization server's side of end users' tokens (worker/http/delegated.py) against a local server:
discovery with its fallback, the grants' answers mapped for the model, revocation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiohttp import web

from tests.support.servers import ServerThread
from worker import errors
from worker.dev.embedded import free_port
from worker.http.delegated import Pkce, ServerEndpoints, authorization_url, discover, grant, revoke
from worker.http.oauth import TokenRequest
from worker.http.transport import HttpTransport


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    app = web.Application()
    base: dict[str, str] = {}

    async def openid(request: web.Request) -> web.Response:  # OpenID discovery only, as oidc-provider serves
        url = base["url"]
        return web.json_response(
            {"issuer": url, "authorization_endpoint": url + "/auth", "token_endpoint": url + "/token"}
        )

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("refresh_token") == "spent":
            return web.json_response({"error": "invalid_grant"}, status=400)
        if form.get("refresh_token") == "broken":
            return web.json_response({"no": "token"})
        return web.json_response({"access_token": "at", "refresh_token": "rt", "expires_in": 60, "scope": "a b"})

    async def revoked(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app.router.add_get("/.well-known/openid-configuration", openid)
    app.router.add_post("/token", token)
    app.router.add_post("/revoke", revoked)
    thread = ServerThread(app).start()
    base["url"] = thread.url
    yield thread.url
    thread.stop()


async def test_discovery_falls_back_to_openid_configuration(server: str) -> None:
    """RFC 8414's document is tried first; a server with only OpenID discovery is found there."""
    transport = HttpTransport()
    try:
        found = await discover(transport, server, 5, True)
    finally:
        await transport.close()
    assert (found.authorization_url, found.token_url, found.issuer) == (server + "/auth", server + "/token", server)


async def test_an_unreachable_server_is_69_and_one_without_metadata_78(server: str) -> None:
    """Discovery tells a server that is down (try later) from one that has no metadata (the operator's)."""
    transport = HttpTransport()
    try:
        with pytest.raises(errors.UpstreamUnavailable):
            await discover(transport, f"http://127.0.0.1:{free_port()}", 2, True)
        with pytest.raises(errors.ToolMisconfigured):
            await discover(transport, server + "/elsewhere", 5, True)
    finally:
        await transport.close()


@pytest.mark.parametrize(
    ("refresh", "error"), [("spent", errors.AuthorizationRequired), ("broken", errors.ToolMisconfigured)]
)
async def test_a_refused_grant_is_67_and_a_broken_answer_78(server: str, refresh: str, error: type) -> None:
    """invalid_grant means the user must connect again (67, naming the error code, never the token); an
    answer without a token is the operator's problem (78)."""
    transport = HttpTransport()
    form = {"grant_type": "refresh_token", "refresh_token": refresh}
    try:
        with pytest.raises(error) as raised:
            await grant(transport, TokenRequest(server + "/token", form, None, 5, True))
    finally:
        await transport.close()
    assert refresh not in str(raised.value)


async def test_a_grant_and_a_revocation(server: str) -> None:
    """A token answer gives the access and refresh tokens, lifetime and scopes; revocation answers True."""
    transport = HttpTransport()
    try:
        issued = await grant(transport, TokenRequest(server + "/token", {"grant_type": "x"}, None, 5, True))
        revoked = await revoke(transport, TokenRequest(server + "/revoke", {"token": "rt"}, None, 5, True))
    finally:
        await transport.close()
    assert (issued.access_token, issued.refresh_token, issued.expires_in_s, issued.scopes) == (
        "at",
        "rt",
        60,
        ("a", "b"),
    )
    assert revoked


def test_the_authorization_url_always_carries_pkce_s256() -> None:
    """The user's browser is sent with state, redirect URI, scopes, extra parameters and an S256 challenge."""
    pkce = Pkce.new()
    url = authorization_url(
        ServerEndpoints("https://as/auth?x=1", "https://as/token"),
        "app",
        "https://gw/cb",
        ("a", "b"),
        "st",
        pkce,
        {"resource": "r"},
    )
    assert url.startswith("https://as/auth?x=1&response_type=code&client_id=app")
    assert f"code_challenge={pkce.challenge}" in url and "code_challenge_method=S256" in url
    assert "scope=a+b" in url and "resource=r" in url and "state=st" in url and pkce.verifier not in url
