"""Upstream authentication without a network: credentials on requests, secret files, per-call tokens,
the fleet's token cache, the token endpoint's answers, and OpenAPI security schemes as skeletons."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import yaml
from aiohttp import web

from tests.support.servers import ServerThread
from worker import errors
from worker.call.auth import TokenCache, authorize
from worker.call.rendering import render
from worker.call.renewal import SEND_MARGIN_S
from worker.definitions.file_store import unset_settings
from worker.definitions.model import RequestTemplate, Source, Tool, ToolSet, Upstream
from worker.definitions.readers.openapi import import_openapi
from worker.definitions.readers.upstreams import UpstreamModel, build_upstream
from worker.dev.embedded import free_port
from worker.http.oauth import Token, TokenRequest, fetch_token
from worker.http.transport import HttpTransport
from worker.protocol import ToolCall

ENVIRON = {"API_TOKEN": "tok-1234567", "API_USER": "ada", "API_PASSWORD": "pw-98765", "API_KEY": "key-abcdef"}
TOOL = Tool("get_item", "api", RequestTemplate(method="GET"))


def upstream(auth: dict[str, Any], **extra: Any) -> Upstream:
    model = UpstreamModel.model_validate({"base_url": "http://127.0.0.1:9/v1", "auth": auth, **extra})
    return build_upstream("api", model, Source("test"))


async def authorized(up: Upstream, headers: dict[str, str] | None = None, tokens: TokenCache | None = None) -> Any:
    call = ToolCall.model_validate({"callId": "c1", "tool": "get_item", "headers": headers or {}})
    request = render(TOOL, up, {}, call.headers, ENVIRON)
    transport = HttpTransport()
    try:
        authed, _ = await authorize(request, up, call, ENVIRON, tokens or TokenCache(None), time.time() + 10, transport)
    finally:
        await transport.close()
    return authed


async def test_bearer_basic_and_header_api_key_are_headers_and_secrets() -> None:
    """Each static type sets its header; the value is a secret, redacted wherever the request is shown."""
    bearer = await authorized(upstream({"type": "bearer", "token": "${env:API_TOKEN}"}))
    basic = await authorized(
        upstream({"type": "basic", "username": "${env:API_USER}", "password": "${env:API_PASSWORD}"})
    )
    key = await authorized(
        upstream({"type": "api_key", "in": "header", "name": "X-Api-Key", "value": "${env:API_KEY}"})
    )
    assert dict(bearer.headers)["Authorization"] == "Bearer tok-1234567"
    assert dict(basic.headers)["Authorization"] == "Basic " + base64.b64encode(b"ada:pw-98765").decode()
    assert dict(key.headers)["X-Api-Key"] == "key-abcdef"
    for request in (bearer, basic, key):
        assert set(request.redacted_headers().values()) == {"[redacted]"}


async def test_api_key_in_the_query_is_redacted_in_the_url() -> None:
    """A query API key lands in the URL, percent-encoded, and is a secret there."""
    request = await authorized(upstream({"type": "api_key", "in": "query", "name": "api_key", "value": "k y+/1234"}))
    assert request.url.endswith("?api_key=k%20y%2B%2F1234")
    assert "k%20y%2B%2F1234" in request.secrets


def test_a_secret_file_is_read_at_load_without_its_newline(tmp_path: Path) -> None:
    """`${file:...}` holds the file's text as it was at load, trailing newline stripped."""
    secret = tmp_path / "token"
    secret.write_text("from-a-file-42\n")
    up = upstream({"type": "bearer", "token": f"${{file:{secret}}}"})
    secret.write_text("changed later\n")  # read again on the next load, not at call time
    assert asyncio.run(authorized(up)).headers[-1] == ("Authorization", "Bearer from-a-file-42")


async def test_an_unreadable_secret_file_is_exit_78_and_reported(tmp_path: Path) -> None:
    """A secret file that cannot be read makes the upstream's calls 78, and validation names it."""
    up = upstream({"type": "bearer", "token": f"${{file:{tmp_path / 'missing'}}}"})
    with pytest.raises(errors.ToolMisconfigured, match="secret file"):
        await authorized(up)
    assert unset_settings(ToolSet(upstreams={"api": up}), {}) == [
        f"api: the secret file {tmp_path / 'missing'} cannot be read"
    ]


def test_unset_variables_are_reported() -> None:
    """Validation lists the `${env:...}` of an upstream that the environment lacks (defaults excepted)."""
    up = upstream({"type": "basic", "username": "${env:NOPE_USER}", "password": "${env:NOPE_PW:-x}"})
    assert unset_settings(ToolSet(upstreams={"api": up}), {}) == ["api: ${env:NOPE_USER} is unset"]


async def test_a_per_call_token_replaces_the_upstreams_own() -> None:
    """An upstream that names a call header takes the user's token from it instead of its own."""
    up = upstream({"type": "bearer", "token": "${env:API_TOKEN}", "per_call_header": "X-User-Token"})
    request = await authorized(up, {"X-User-Token": "user-token-777"})
    assert ("Authorization", "Bearer user-token-777") in request.headers
    assert "user-token-777" in request.secrets and "tok-1234567" not in request.secrets
    assert "X-User-Token" not in dict(request.headers)  # consumed, not forwarded


async def test_a_user_token_is_dropped_where_the_upstream_does_not_take_one() -> None:
    """Without `per_call_header` the call header is dropped, as any header the upstream does not list."""
    request = await authorized(upstream({"type": "bearer", "token": "${env:API_TOKEN}"}), {"X-User-Token": "u-1"})
    assert ("Authorization", "Bearer tok-1234567") in request.headers
    assert request.dropped_headers == ("X-User-Token",)


async def test_a_bearer_that_only_calls_bring_needs_the_call_header() -> None:
    """An upstream whose bearer comes only from calls refuses a call without it (65), naming the header."""
    up = upstream({"type": "bearer", "per_call_header": "X-User-Token"})
    with pytest.raises(errors.InvalidArguments, match="x-user-token"):
        await authorized(up)


class Fetches:
    def __init__(self, lifetime_s: float) -> None:
        self.count = 0
        self.lifetime_s = lifetime_s

    async def __call__(self) -> Token:
        self.count += 1
        await asyncio.sleep(0.05)
        return Token(f"token-{self.count}", self.lifetime_s)


async def test_two_processes_share_one_token_fetch() -> None:
    """Two workers (two caches, one Redis) asking at once fetch one token between them."""
    shared = fakeredis.aioredis.FakeRedis()
    first, second, fetch = TokenCache(shared), TokenCache(shared), Fetches(60)
    tokens = await asyncio.gather(*(cache.token("k", fetch, time.time() + 5) for cache in (first, second) * 5))
    assert set(tokens) == {"token-1"} and fetch.count == 1


async def test_a_refused_token_is_replaced_once_for_everyone() -> None:
    """After a 401, both workers pass the refused token as stale: one new token is fetched, and both use it."""
    shared = fakeredis.aioredis.FakeRedis()
    first, second, fetch = TokenCache(shared), TokenCache(shared), Fetches(60)
    old = await first.token("k", fetch, time.time() + 5)
    renewed = await asyncio.gather(
        first.token("k", fetch, time.time() + 5, stale=old), second.token("k", fetch, time.time() + 5, stale=old)
    )
    assert renewed == ["token-2", "token-2"] and fetch.count == 2


class Clock:
    """Wall-clock time that moves only when the test says."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_a_token_is_refreshed_ahead_of_its_expiry() -> None:
    """Past four fifths of its lifetime a token is replaced, once, before it expires; not a moment before."""
    clock, fetch = Clock(), Fetches(60)
    cache = TokenCache(fakeredis.aioredis.FakeRedis(), clock)
    assert await cache.token("k", fetch, clock.now + 5) == "token-1"
    clock.now += 47.9  # short of the refresh point (48 s of 60)
    assert await cache.token("k", fetch, clock.now + 5) == "token-1"
    clock.now += 0.2  # past it, well before the expiry
    assert await cache.token("k", fetch, clock.now + 5) == "token-2"
    assert await cache.token("k", fetch, clock.now + 5) == "token-2" and fetch.count == 2


async def test_a_tokens_lifetime_runs_from_its_request_and_it_is_not_sent_in_its_last_moments() -> None:
    """A token whose answer took 2 s expires 60 s after its request was sent, not after the answer came; while
    another worker renews it, one with less than the send margin left is not handed out."""
    shared, clock = fakeredis.aioredis.FakeRedis(), Clock()
    sent_at = clock.now

    async def slow() -> Token:
        clock.now += 2.0  # the token server answers 2 s after the request
        return Token("token-1", 60)

    cache = TokenCache(shared, clock)
    cached = await cache.cached("k", slow, clock.now + 5)
    assert cached.expires_at == sent_at + 60
    other = TokenCache(shared, clock)
    await shared.set("k:lock", "1")  # another worker is renewing it
    clock.now = sent_at + 60 - SEND_MARGIN_S / 2  # within the send margin of its expiry
    with pytest.raises(errors.TimedOut, match="access token"):
        await other.token("k", slow, clock.now - 1)


@pytest.mark.timeout(10)
async def test_a_worker_waits_for_another_ones_fetch_until_its_deadline() -> None:
    """While another worker holds the fetch and no usable token exists, a call waits until its deadline on
    the cache's clock (an hour ahead of the machine's here), then times out."""
    shared, clock = fakeredis.aioredis.FakeRedis(), Clock()
    clock.now += 3600
    await shared.set("k:lock", "1")  # another worker is fetching
    cache = TokenCache(shared, clock)

    async def never() -> Token:
        raise AssertionError("the lock holder fetches, not this worker")

    with pytest.raises(errors.TimedOut, match="access token"):
        await cache.token("k", never, clock.now - 1)


async def fetched(request: TokenRequest) -> Token:
    """One token request through a transport of its own."""
    transport = HttpTransport()
    try:
        return await fetch_token(transport, request)
    finally:
        await transport.close()


def test_a_token_endpoint_that_redirects_is_refused_and_the_secret_goes_nowhere_else() -> None:
    """A redirect from the token endpoint is a configuration error (78); the client secret is never sent
    to the redirect's target, not even on the same host."""
    seen: list[bytes] = []

    async def token(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/elsewhere")  # 307: a client following it would send the form again

    async def elsewhere(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"access_token": "t", "expires_in": 60})

    app = web.Application()
    app.router.add_post("/token", token)
    app.router.add_post("/elsewhere", elsewhere)
    server = ServerThread(app).start()
    try:
        form = {"grant_type": "client_credentials", "client_secret": "s3cr3t-x"}
        with pytest.raises(errors.ToolMisconfigured, match="redirect") as raised:
            asyncio.run(fetched(TokenRequest(server.url + "/token", form, None, 5, True)))
    finally:
        server.stop()
    assert seen == [] and "s3cr3t-x" not in raised.value.message


async def test_the_token_endpoint_down_is_unavailable_69() -> None:
    """Nothing listening at the token URL is exit 69, with no secret in the message."""
    request = TokenRequest(f"http://127.0.0.1:{free_port()}/token", {"client_secret": "s3cr3t-x"}, None, 2, True)
    with pytest.raises(errors.UpstreamUnavailable) as raised:
        await fetched(request)
    assert "s3cr3t-x" not in raised.value.message


@pytest.mark.parametrize(("status", "error"), [(401, errors.ToolMisconfigured), (503, errors.UpstreamUnavailable)])
def test_token_endpoint_refusals(status: int, error: type[errors.ToolError]) -> None:
    """A refused client is 78 (configuration); an endpoint answering 5xx is 69 (unavailable)."""

    async def token(request: web.Request) -> web.Response:
        return web.json_response({"error": "invalid_client"}, status=status)

    app = web.Application()
    app.router.add_post("/token", token)
    server = ServerThread(app).start()
    try:
        with pytest.raises(error):
            asyncio.run(fetched(TokenRequest(server.url + "/token", {}, ("id", "secret"), 5, True)))
    finally:
        server.stop()


SPEC = {
    "openapi": "3.0.3",
    "info": {"title": "t", "version": "1"},
    "servers": [{"url": "https://api.example.com"}],
    "paths": {"/items": {"get": {"operationId": "list_items", "responses": {"200": {"description": "ok"}}}}},
}
SCHEMES = {
    "key_header": (
        {"type": "apiKey", "in": "header", "name": "X-Key"},
        {"type": "api_key", "in": "header", "name": "X-Key", "value": "${env:SHOP_API_KEY}"},
    ),
    "key_query": (
        {"type": "apiKey", "in": "query", "name": "key"},
        {"type": "api_key", "in": "query", "name": "key", "value": "${env:SHOP_API_KEY}"},
    ),
    "bearer": ({"type": "http", "scheme": "bearer"}, {"type": "bearer", "token": "${env:SHOP_TOKEN}"}),
    "basic": (
        {"type": "http", "scheme": "basic"},
        {"type": "basic", "username": "${env:SHOP_USERNAME}", "password": "${env:SHOP_PASSWORD}"},
    ),
    "oauth2": (
        {
            "type": "oauth2",
            "flows": {
                "clientCredentials": {"tokenUrl": "https://auth.example.com/token", "scopes": {"read": "", "write": ""}}
            },
        },
        {
            "type": "oauth2_client_credentials",
            "token_url": "https://auth.example.com/token",
            "client_id": "${env:SHOP_CLIENT_ID}",
            "client_secret": "${env:SHOP_CLIENT_SECRET}",
            "scope": "read write",
        },
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_security_scheme_imports_as_a_skeleton(tmp_path: Path, name: str) -> None:
    """A spec's security scheme becomes the upstream's `auth:` with placeholders named after the upstream,
    and the imported document loads."""
    scheme, expected = SCHEMES[name]
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump({**SPEC, "components": {"securitySchemes": {name: scheme}}, "security": [{name: []}]})
    )
    imported = import_openapi(spec, "shop", None, [])
    assert imported["upstreams"]["shop"]["auth"] == expected
    build_upstream("shop", UpstreamModel.model_validate(imported["upstreams"]["shop"]), Source("import"))
