"""An MCP upstream whose `auth:` (oauth2_user, oauth2_client_credentials) names no endpoints, made whole by
authorization discovery (worker/mcp_client/authorization.py): the upstream the vault's flow and the
client-credentials fetch then use unchanged, with the discovered endpoints, scopes and `resource` (RFC 8707).

    toolworker:mcp:authorization:<upstream>:<digest of the URL>   what discovery found (JSON, no secret)

Discovery runs once per server for the fleet while its record lasts (DISCOVERY_TTL_S); a process keeps what it
read. The endpoints read back are held to this process's egress policy again (the gateway's and the workers'
may differ).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import replace

import redis.asyncio as aioredis

from worker import errors
from worker.call.rendering import render_secret
from worker.definitions.model import Auth, Upstream
from worker.definitions.templates import Template
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport
from worker.mcp_client.authorization import Challenge, Discovered, Guard, discover, probe, transport_fetch

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


class McpAuthorization:
    """Discovery for the MCP upstreams of one process, shared with the fleet through Redis."""

    def __init__(self, redis: aioredis.Redis | None, policy: EgressPolicy, transport: HttpTransport) -> None:
        self._redis = redis
        self.policy = policy
        self.transport = transport
        self._found: dict[str, Discovered] = {}

    async def upstream(self, upstream: Upstream, environ: Mapping[str, str], deadline: float) -> Upstream:
        """The upstream as its OAuth flow uses it: unchanged unless its endpoints are left to discovery."""
        if not needs_discovery(upstream):
            return upstream
        assert upstream.auth is not None
        found = await self.discovered(upstream, environ, deadline)
        return replace(upstream, auth=with_endpoints(upstream.auth, found))

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
        timeout_s = min(upstream.timeout_s, deadline - time.time())
        if timeout_s <= 0:
            raise errors.TimedOut("The call ran out of time before the MCP server's authorization was discovered.")
        challenge = await probe(url, upstream.name, timeout_s, upstream.verify_tls)
        fetch = transport_fetch(self.transport, guard, timeout_s, upstream.verify_tls)
        return await discover(fetch, guard, url, challenge or Challenge())
