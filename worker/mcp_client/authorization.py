"""Authorization discovery as the MCP specification's client (2025-11-25): from the server's 401 to the
endpoints, scopes and resource that the vault's OAuth flow (worker/call/delegated.py) then uses.

    401 WWW-Authenticate (resource_metadata, scope)
      └▶ Protected Resource Metadata (RFC 9728): the header's URL, else the path-aware well-known URL,
         then the root one
           └▶ authorization server metadata (RFC 8414, then OpenID discovery, path-insertion forms
              first), its `issuer` the one the resource named; PKCE S256 offered, or the server refused

Every URL fetched here, and every endpoint the metadata names that the fleet would send to, passes the
egress policy unless it is on the MCP server's own origin: a refusal is EgressBlocked (77) naming the refused
origin, raised before anything connects there. The SDK's helpers (mcp.client.auth.utils, mcp.shared.auth)
build the URLs, parse the documents and pick the scopes; the requests go through the fleet's transport.

The client's identity at that server, when the upstream names no `client_id`: a Client ID Metadata Document
(the server says `client_id_metadata_document_supported`), else RFC 7591 dynamic registration at its
`registration_endpoint` (`register`, here; kept by worker/call/mcp_clients.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx2
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    extract_field_from_www_auth,
    get_client_metadata_scopes,
    issuers_match,
)
from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from pydantic import ValidationError
from yarl import URL

from worker import errors
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport, Limits, PoolSpec, PreparedRequest
from worker.mcp_client.failures import mapped

MAX_METADATA_BYTES = 256 * 1024
# The grants an end user's connection uses: offline_access is asked for only when the server offers it.
USER_GRANTS = ["authorization_code", "refresh_token"]
# What the probe of a protected server sends: an `initialize` it refuses unread without a token.
PROBE_BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "toolworker", "version": "1"},
        },
    }
)

# GET a URL: (status, body); the seam unit tests drive without a network.
Fetch = Callable[[str], Awaitable[tuple[int, bytes]]]
# POST a JSON body to a URL: (status, body).
Post = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]
# How a registered client authenticates at the token endpoint, by RFC 7591's names: form fields, or Basic.
AUTH_METHODS = {"client_secret_basic": "basic", "client_secret_post": "body", "none": "body"}


@dataclass(frozen=True, slots=True)
class Challenge:
    """What a 401 or 403 from the server asks for (RFC 6750 §3, RFC 9728 §5.1)."""

    resource_metadata: str | None = None
    scope: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, status: int, www_authenticate: str | None) -> Challenge:
        if not www_authenticate:
            return cls()
        response = httpx2.Response(status, headers={"WWW-Authenticate": www_authenticate})
        fields = (extract_field_from_www_auth(response, name) for name in ("resource_metadata", "scope", "error"))
        return cls(*fields)


@dataclass(frozen=True, slots=True)
class Discovered:
    """An MCP server's authorization server as discovery found it."""

    resource: str  # the canonical URL tokens are asked for (RFC 8707 `resource`)
    issuer: str
    authorization_url: str
    token_url: str
    registration_url: str | None
    revocation_url: str | None
    scopes: tuple[str, ...]  # for a user's connection: offline_access added when offered
    service_scopes: tuple[str, ...]  # for the fleet's own token (client credentials): as selected
    metadata_document_supported: bool  # a Client ID Metadata Document may name the client

    def to_json(self) -> str:
        return json.dumps({name: getattr(self, name) for name in self.__slots__})

    @classmethod
    def from_json(cls, text: str | bytes) -> Discovered:
        data = json.loads(text)
        data["scopes"], data["service_scopes"] = tuple(data["scopes"]), tuple(data["service_scopes"])
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Registered:
    """The fleet's client at an authorization server, registered dynamically (RFC 7591)."""

    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    auth_method: str = "body"  # "body" (form fields) or "basic"
    expires_at: float = 0.0  # when the server says the secret expires (0: never)


def registration_request(client_name: str, redirect_uri: str) -> dict[str, object]:
    """The client metadata (RFC 7591 §2) the fleet registers with: a confidential client of the code flow."""
    return {
        "client_name": client_name,
        "redirect_uris": [redirect_uri],
        "grant_types": USER_GRANTS,
        "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_post",
    }


async def register(post: Post, guard: Guard, registration_url: str, client_name: str, redirect_uri: str) -> Registered:
    """A new client at the server's registration endpoint (held to the egress policy first)."""
    guard.check(registration_url)
    status, body = await post(registration_url, json.dumps(registration_request(client_name, redirect_uri)).encode())
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status not in (200, 201) or not isinstance(answer, dict) or not isinstance(answer.get("client_id"), str):
        error = answer.get("error") if isinstance(answer, dict) else None
        why = f" ({error})" if isinstance(error, str) and error.replace("_", "").isalnum() else ""
        raise _misconfigured(guard, f"its authorization server refused to register the fleet as a client{why}")
    secret = answer.get("client_secret")
    expires = answer.get("client_secret_expires_at")
    return Registered(
        answer["client_id"],
        secret if isinstance(secret, str) and secret else None,
        AUTH_METHODS.get(str(answer.get("token_endpoint_auth_method") or "client_secret_basic"), "body"),
        float(expires) if isinstance(expires, (int, float)) and expires > 0 else 0.0,
    )


class Guard:
    """Every URL discovery reaches, held to the egress policy unless it is on the MCP server's own origin."""

    def __init__(self, policy: EgressPolicy, server_url: str, server_name: str) -> None:
        self.policy = policy
        self.origin = URL(server_url, encoded=True).origin()
        self.server_name = server_name

    def own(self, url: str) -> bool:
        return URL(url, encoded=True).origin() == self.origin

    def check(self, url: str) -> None:
        """EgressBlocked (77) naming the URL's origin when the policy refuses it."""
        if self.own(url):
            return
        try:
            self.policy.check_url(url)
        except errors.ToolError as exc:
            raise self.refused(url, exc) from None

    def refused(self, url: str, exc: errors.ToolError) -> errors.EgressBlocked:
        return errors.EgressBlocked(
            f"Authorization discovery for the MCP server {self.server_name!r} led to {_origin(url)}, which the "
            f"egress policy refuses ({exc.message}); nothing was sent there. Tell the operator."
        )


def _origin(url: str) -> str:
    try:
        return str(URL(url, encoded=True).origin())
    except ValueError:
        return repr(url[:200])


async def discover(fetch: Fetch, guard: Guard, server_url: str, challenge: Challenge) -> Discovered:
    """The server's authorization server, endpoints, resource and scopes, from its 401's challenge."""
    resource = resource_url_from_server_url(server_url)
    prm = await _protected_resource(fetch, guard, server_url, challenge)
    if not check_resource_allowed(resource, str(prm.resource)):
        raise _misconfigured(guard, f"its resource metadata names another resource ({prm.resource})")
    issuer = str(prm.authorization_servers[0])
    metadata = await _server_metadata(fetch, guard, server_url, issuer)
    for endpoint in (metadata.token_endpoint, metadata.registration_endpoint, metadata.revocation_endpoint):
        if endpoint is not None:
            guard.check(str(endpoint))
    user = get_client_metadata_scopes(challenge.scope, prm, metadata, USER_GRANTS)
    service = get_client_metadata_scopes(challenge.scope, prm, metadata, None)
    return Discovered(
        resource=str(prm.resource) if challenge.resource_metadata else resource,
        issuer=str(metadata.issuer),
        authorization_url=str(metadata.authorization_endpoint),
        token_url=str(metadata.token_endpoint),
        registration_url=_text(metadata.registration_endpoint),
        revocation_url=_text(metadata.revocation_endpoint),
        scopes=tuple((user or "").split()),
        service_scopes=tuple((service or "").split()),
        metadata_document_supported=bool(metadata.client_id_metadata_document_supported),
    )


def _text(value: object | None) -> str | None:
    return None if value is None else str(value)


async def _protected_resource(
    fetch: Fetch, guard: Guard, server_url: str, challenge: Challenge
) -> ProtectedResourceMetadata:
    for url in build_protected_resource_metadata_discovery_urls(challenge.resource_metadata, server_url):
        document = await _document(fetch, guard, url)
        if document is None:
            continue
        try:
            return ProtectedResourceMetadata.model_validate(document)
        except ValidationError:
            continue
    raise _misconfigured(guard, "it publishes no usable Protected Resource Metadata (RFC 9728)")


async def _server_metadata(fetch: Fetch, guard: Guard, server_url: str, issuer: str) -> OAuthMetadata:
    for url in build_oauth_authorization_server_metadata_discovery_urls(issuer, server_url):
        document = await _document(fetch, guard, url)
        if document is None:
            continue
        try:
            metadata = OAuthMetadata.model_validate(document)
        except ValidationError:
            continue
        if not issuers_match(str(metadata.issuer), issuer):
            raise _misconfigured(guard, f"its authorization server's metadata names another issuer ({metadata.issuer})")
        if "S256" not in (metadata.code_challenge_methods_supported or []):
            raise _misconfigured(guard, f"its authorization server {issuer} does not offer PKCE S256")
        return metadata
    raise _misconfigured(guard, f"its authorization server {issuer} publishes no metadata (RFC 8414 or OpenID)")


async def _document(fetch: Fetch, guard: Guard, url: str) -> dict[str, object] | None:
    """The JSON object a metadata URL answers 200 with; None for any other answer."""
    guard.check(url)
    status, body = await fetch(url)
    if status != 200:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _misconfigured(guard: Guard, why: str) -> errors.ToolMisconfigured:
    return errors.ToolMisconfigured(
        f"The MCP server {guard.server_name!r} needs authorization, and {why}. Tell the operator."
    )


def transport_fetch(transport: HttpTransport, guard: Guard, timeout_s: float, verify_tls: bool) -> Fetch:
    """GET through the fleet's transport, never redirected: the server's own origin on its own pool, any other
    on the egress-checked one (which checks the address each connection reaches as well)."""
    send = _sender(transport, guard, timeout_s, verify_tls)

    async def fetch(url: str) -> tuple[int, bytes]:
        return await send(
            PreparedRequest("GET", url, (("Accept", "application/json"),), None, frozenset(), frozenset())
        )

    return fetch


def transport_post(transport: HttpTransport, guard: Guard, timeout_s: float, verify_tls: bool) -> Post:
    """POST a JSON body the way `transport_fetch` GETs (a registration request)."""
    send = _sender(transport, guard, timeout_s, verify_tls)
    headers = (("Content-Type", "application/json"), ("Accept", "application/json"))

    async def post(url: str, body: bytes) -> tuple[int, bytes]:
        return await send(PreparedRequest("POST", url, headers, body, frozenset(), frozenset()))

    return post


def _sender(
    transport: HttpTransport, guard: Guard, timeout_s: float, verify_tls: bool
) -> Callable[[PreparedRequest], Awaitable[tuple[int, bytes]]]:
    limits = Limits(MAX_METADATA_BYTES, timeout_s)

    async def send(request: PreparedRequest) -> tuple[int, bytes]:
        url = request.url
        spec = PoolSpec(f"(mcp authorization) {guard.origin}", verify_tls, 4, timeout_s)
        trusted = guard.origin if guard.own(url) else None
        try:
            async with asyncio.timeout(timeout_s):
                response = await transport.send(request, spec, limits, _no_redirect, trusted)
        except errors.EgressBlocked as exc:  # the address the name resolved to
            raise guard.refused(url, exc) from None
        except (TimeoutError, errors.TransportError):
            raise errors.UpstreamUnavailable(
                f"The authorization server of the MCP server {guard.server_name!r} could not be reached "
                f"({_origin(url)}). Try again later."
            ) from None
        return response.status, response.body

    return send


def _no_redirect(target: URL) -> None:
    raise errors.ToolMisconfigured(
        "An MCP server's authorization metadata answered with a redirect. Tell the operator."
    )


async def probe(url: str, server_name: str, timeout_s: float, verify_tls: bool) -> Challenge | None:
    """The challenge the server answers a request without a token with; None when it needs none."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    try:
        async with httpx2.AsyncClient(timeout=timeout_s, verify=verify_tls, follow_redirects=False) as client:
            response = await client.post(url, content=PROBE_BODY, headers=headers)
    except (httpx2.HTTPError, OSError) as exc:
        raise mapped(exc, server_name) from exc
    status, www_authenticate = response.status_code, response.headers.get("WWW-Authenticate")
    if status not in (401, 403):
        return None
    return Challenge.of(status, www_authenticate)
