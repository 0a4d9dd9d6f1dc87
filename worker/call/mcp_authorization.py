"""An MCP upstream whose `auth:` (oauth2_user, oauth2_client_credentials) names no endpoints, made whole by
authorization discovery (worker/mcp_client/authorization.py): the upstream the vault's flow and the
client-credentials fetch then use unchanged, with the discovered endpoints, scopes and `resource` (RFC 8707).

    toolworker:mcp:authorization:<upstream>:<digest of the URL>   what discovery found (JSON, no secret)

Discovery runs once per server for the fleet while its record lasts (DISCOVERY_TTL_S); a process keeps what it
read. The endpoints read back are held to this process's egress policy again (the gateway's and the workers'
may differ). An `oauth2_user` upstream without a `client_id` gets the fleet's client identity at the server
(worker/call/mcp_clients.py: a Client ID Metadata Document, else a dynamic registration).

A 403 `insufficient_scope` from the server is a step-up (`step_up`): the call ends 67 with a new connect link
asking for the union of the scopes the user's token holds and the ones the server asks for; when the token
already holds them all, or the user's last consent asked for them and was granted less, a new consent could only
loop, and the call ends with an error saying so instead (67, without a link).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import replace

import redis.asyncio as aioredis
from mcp.client.auth.utils import union_scopes

from worker import errors
from worker.call.connect import CALLBACK_PATH
from worker.call.delegated import UserTokens
from worker.call.mcp_clients import Registrations, document_url
from worker.call.rendering import render_secret
from worker.definitions.model import Auth, Upstream
from worker.definitions.templates import Template
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport
from worker.mcp_client.authorization import (
    Challenge,
    Discovered,
    Guard,
    Registered,
    discover,
    probe,
    register,
    transport_fetch,
    transport_post,
)
from worker.mcp_client.challenges import Challenged
from worker.sealing import Keyring

KEY_PREFIX = "toolworker:mcp:authorization:"
# How long what discovery found serves the fleet before the server is asked again.
DISCOVERY_TTL_S = 3600
DISCOVERED_TYPES = ("oauth2_user", "oauth2_client_credentials")


def needs_discovery(upstream: Upstream) -> bool:
    """An MCP upstream whose OAuth endpoints are left to discovery."""
    auth = upstream.auth
    if upstream.mcp is None or auth is None or auth.type not in DISCOVERED_TYPES:
        return False
    if auth.type == "oauth2_user":
        return auth.issuer is None and auth.authorization_url is None
    return auth.token_url is None


def with_endpoints(auth: Auth, found: Discovered) -> Auth:
    """The upstream's auth with what discovery found where it said nothing itself."""
    extra = {"resource": Template.literal(found.resource), **auth.extra_params}
    literal = Template.literal
    if auth.type == "oauth2_client_credentials":
        scope = auth.scope or " ".join(found.service_scopes) or None
        return replace(auth, token_url=literal(found.token_url), scope=scope, extra_params=extra)
    revocation = literal(found.revocation_url) if found.revocation_url else auth.revocation_url
    return replace(
        auth,
        authorization_url=literal(found.authorization_url),
        token_url=literal(found.token_url),
        revocation_url=revocation,
        scopes=auth.scopes or found.scopes,
        extra_params=extra,
    )


class _Hidden(str):
    """A registered client's secret as a template's literal text: never shown by a repr."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'<registered client secret>'"


def with_client(auth: Auth, client_id: str, registered: Registered | None = None) -> Auth:
    """The upstream's auth naming the fleet's client: a metadata document's URL, or a registration."""
    if registered is None:
        return replace(auth, client_id=Template.literal(client_id), client_secret=None, auth_method="body")
    secret = registered.client_secret
    hidden = None if secret is None else Template((_Hidden(secret),), "<registered client secret>")
    return replace(
        auth, client_id=Template.literal(registered.client_id), client_secret=hidden, auth_method=registered.auth_method
    )


class McpAuthorization:
    """Discovery for the MCP upstreams of one process, shared with the fleet through Redis; with the gateway's
    public URL (connect links) and the vault's keys, the fleet's client identity at the servers too."""

    def __init__(
        self,
        redis: aioredis.Redis | None,
        policy: EgressPolicy,
        transport: HttpTransport,
        keyring: Keyring | None = None,
        public_url: str | None = None,
    ) -> None:
        self._redis = redis
        self.policy = policy
        self.transport = transport
        self.public_url = public_url.rstrip("/") if public_url else None
        self.registrations = Registrations(redis, keyring) if keyring else None
        self._found: dict[str, Discovered] = {}

    async def upstream(self, upstream: Upstream, environ: Mapping[str, str], deadline: float) -> Upstream:
        """The upstream as its OAuth flow uses it: unchanged unless its endpoints are left to discovery."""
        if not needs_discovery(upstream):
            return upstream
        assert upstream.auth is not None
        found = await self.discovered(upstream, environ, deadline)
        auth = with_endpoints(upstream.auth, found)
        if auth.type == "oauth2_user" and auth.client_id is None:
            auth = await self._identified(upstream, auth, found, environ, deadline)
        return replace(upstream, auth=auth)

    async def _identified(
        self, upstream: Upstream, auth: Auth, found: Discovered, environ: Mapping[str, str], deadline: float
    ) -> Auth:
        """The auth with the fleet's client at the server: its metadata document when the server takes one, else
        its registration (registered now when there is none). Unchanged without a public URL or vault keys."""
        if self.public_url is None:
            return auth
        if found.metadata_document_supported:
            return with_client(auth, document_url(self.public_url, upstream.name))
        if found.registration_url is None or self.registrations is None:
            return auth
        redirect_uri = self.public_url + CALLBACK_PATH
        key = Registrations.key(upstream.name, found.issuer, redirect_uri)
        registered = await self.registrations.get(key)
        if registered is None:
            url = render_secret(upstream.base_url, environ)
            guard = Guard(self.policy, url, upstream.name)
            post = transport_post(self.transport, guard, _time_left(upstream, deadline), upstream.verify_tls)
            new = await register(post, guard, found.registration_url, f"toolworker ({upstream.name})", redirect_uri)
            registered = await self.registrations.keep(key, new)
        return with_client(auth, registered.client_id, registered)

    async def forget_client(self, upstream: str) -> None:
        """The server rejected the fleet's registered client (`invalid_client`): the next flow registers anew."""
        if self.registrations is not None:
            await self.registrations.forget(upstream)

    async def discovered(self, upstream: Upstream, environ: Mapping[str, str], deadline: float) -> Discovered:
        url = render_secret(upstream.base_url, environ)
        key = f"{KEY_PREFIX}{upstream.name}:{hashlib.sha256(url.encode()).hexdigest()[:16]}"
        guard = Guard(self.policy, url, upstream.name)
        found = self._found.get(key) or await self._stored(key)
        if found is None:
            found = await self._discover(upstream, url, guard, deadline)
            if self._redis is not None:
                await self._redis.set(key, found.to_json(), ex=DISCOVERY_TTL_S)
        for endpoint in (found.token_url, found.registration_url, found.revocation_url):
            if endpoint is not None:
                guard.check(endpoint)
        self._found[key] = found
        return found

    async def _stored(self, key: str) -> Discovered | None:
        text = None if self._redis is None else await self._redis.get(key)
        return None if text is None else Discovered.from_json(text)

    async def _discover(self, upstream: Upstream, url: str, guard: Guard, deadline: float) -> Discovered:
        timeout_s = _time_left(upstream, deadline)
        challenge = await probe(url, upstream.name, timeout_s, upstream.verify_tls)
        fetch = transport_fetch(self.transport, guard, timeout_s, upstream.verify_tls)
        return await discover(fetch, guard, url, challenge or Challenge())


def _time_left(upstream: Upstream, deadline: float) -> float:
    timeout_s = min(upstream.timeout_s, deadline - time.time())
    if timeout_s <= 0:
        raise errors.TimedOut("The call ran out of time before the MCP server's authorization was discovered.")
    return timeout_s


async def step_up(users: UserTokens, user: str | None, upstream: Upstream, refused: Challenged) -> errors.ToolError:
    """What a call ends with when the server refused its token (401 or 403): for a 403 `insufficient_scope` on a
    user's token whose scopes lack some the server asks for, 67 with a link asking for the union of both; a
    refusal a new consent cannot cure (the token holds every scope asked, or it is the fleet's own) says so."""
    auth = upstream.auth
    asked = tuple((refused.challenge.scope or "").split())
    if not refused.step_up:
        return refused
    if auth is None or auth.type != "oauth2_user" or user is None or users.vault is None:
        return errors.AuthorizationRequired(
            f"The MCP server {upstream.name!r} refused the call for want of scope ({' '.join(asked) or 'unnamed'}), "
            "which the upstream's credential does not carry. Tell the operator."
        )
    if not asked:
        return errors.AuthorizationRequired(
            f"The MCP server {upstream.name!r} refused the call for want of a scope it does not name, so no consent "
            "can ask for it. Tell the operator."
        )
    tokens = await users.vault.get(user, upstream.name)
    held = tokens.scopes if tokens is not None else ()
    before = tokens.asked if tokens is not None else auth.scopes  # e.g. offline_access, which no token names
    if set(asked) <= {*held, *before}:
        return errors.AuthorizationRequired(
            f"The MCP server {upstream.name!r} refused the call for want of scope ({' '.join(asked)}) "
            "that the user's grant holds, or that the user's last consent asked for and the authorization server "
            "did not grant: a new consent would not change that. Tell the operator."
        )
    wanted = tuple((union_scopes(union_scopes(" ".join(before), " ".join(held)), " ".join(asked)) or "").split())
    why = f"The MCP server asks for more access than the user granted ({' '.join(asked)}). "
    return await users.required(user, upstream.name, why, wanted)
