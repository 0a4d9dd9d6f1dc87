"""The gateway's side of end users' tokens: whether a user has connected an upstream, connect links, the
authorization code exchange, token exchange at enqueue (RFC 8693) and revocation (RFC 7009).

The gateway talks to authorization servers only (never to an upstream); it needs the `oauth2_user` and
`oauth2_token_exchange` upstreams' client secrets in its environment, and the vault's keys.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import redis.asyncio as aioredis
import structlog

from worker import errors
from worker.call.connect import ConnectLinks, Pending
from worker.call.delegated import Client, Directory, extra_params, token_url
from worker.call.mcp_authorization import McpAuthorization
from worker.call.vault import Connection, Keyring, TokenSet, Vault, audit
from worker.definitions.model import Auth, Upstream
from worker.http.delegated import (
    ACCESS_TOKEN_TYPE,
    TOKEN_EXCHANGE_GRANT,
    ClientRejected,
    Pkce,
    ServerEndpoints,
    authorization_url,
    expiry,
    grant,
    revoke,
)
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport
from worker.settings import Settings

log = structlog.get_logger("toolworker.gateway.delegation")
# Requests to authorization servers from the gateway (discovery, code, exchange, revocation).
AUTHORIZATION_SERVER_TIMEOUT_S = 10.0


class Delegation:
    def __init__(
        self,
        vault: Vault,
        links: ConnectLinks,
        transport: HttpTransport,
        audit_maxlen: int,
        environ: Mapping[str, str] | None = None,
        policy: EgressPolicy | None = None,
    ) -> None:
        self.vault = vault
        self.links = links
        self.transport = transport
        self.directory = Directory()
        self.environ = environ if environ is not None else os.environ
        self._audit_maxlen = audit_maxlen
        # MCP upstreams' authorization servers: what a worker discovered (Redis), else discovered here; and the
        # fleet's client at each (its metadata document's URL, or its registration, shared through Redis).
        policy = policy or EgressPolicy.parse("")
        self.discovery = McpAuthorization(vault.redis, policy, transport, vault.keyring, links.public_url)

    @property
    def enabled(self) -> bool:
        return bool(self.vault.keyring)

    async def connected(self, user: str, upstream: str) -> bool:
        return self.enabled and await self.vault.get(user, upstream) is not None

    async def connections(self, user: str) -> list[Connection]:
        return await self.vault.connections(user) if self.enabled else []

    async def resolved(self, upstream: Upstream) -> Upstream:
        """The upstream with the OAuth endpoints an MCP server's discovery gives it (unchanged otherwise)."""
        deadline = time.time() + AUTHORIZATION_SERVER_TIMEOUT_S
        return await self.discovery.upstream(upstream, self.environ, deadline)

    async def endpoints(self, upstream: Upstream) -> ServerEndpoints:
        assert upstream.auth is not None
        return await self.directory.endpoints(
            upstream.auth, self.environ, self.transport, AUTHORIZATION_SERVER_TIMEOUT_S, upstream.verify_tls
        )

    async def start(
        self, user: str, upstream: Upstream, binding: str, link_expires_at: float, scopes: tuple[str, ...] = ()
    ) -> str:
        """Where the user's browser goes to grant access: a new state and PKCE verifier kept server side; the
        link's `scopes` (a step-up's) in place of the upstream's, when it names some."""
        upstream = await self.resolved(upstream)
        auth = upstream.auth
        assert auth is not None
        endpoints = await self.endpoints(upstream)
        pkce = Pkce.new()
        asked = scopes or auth.scopes
        state = await self.links.begin(user, upstream.name, pkce.verifier, binding, link_expires_at, asked)
        extra = extra_params(auth, self.environ)
        client = Client.of(auth, self.environ)
        return authorization_url(endpoints, client.client_id, self.links.redirect_uri, asked, state, pkce, extra)

    async def finish(self, pending: Pending, upstream: Upstream, code: str, issuer: str | None) -> TokenSet:
        """The code exchanged and the token set stored; AuthorizationRequired when the server refuses it or
        names another issuer (RFC 9207)."""
        upstream = await self.resolved(upstream)
        auth = upstream.auth
        assert auth is not None
        endpoints = await self.endpoints(upstream)
        if issuer is not None and endpoints.issuer is not None and issuer.rstrip("/") != endpoints.issuer.rstrip("/"):
            raise errors.AuthorizationRequired("The authorization response came from another issuer.")
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.links.redirect_uri,
            "code_verifier": pending.verifier,
            **extra_params(auth, self.environ),
        }
        client = Client.of(auth, self.environ)
        request = client.request(endpoints.token_url, form, AUTHORIZATION_SERVER_TIMEOUT_S, upstream.verify_tls)
        sent_at = time.time()
        try:
            issued = await grant(self.transport, request)
        except ClientRejected:  # a registration the server no longer knows: the next link registers anew
            await self.discovery.forget_client(upstream.name)
            raise
        scopes = issued.scopes or pending.scopes or auth.scopes
        asked = pending.scopes or auth.scopes
        tokens = TokenSet(issued.access_token, issued.refresh_token, expiry(issued, sent_at), scopes, sent_at, asked)
        await self.vault.put(pending.user, upstream.name, tokens)
        await audit(self.vault.redis, "connect", pending.user, upstream.name, self._audit_maxlen)
        return tokens

    async def revoke(self, user: str, upstream: Upstream | None, name: str) -> bool | None:
        """Revoke the user's grant at the server (when it offers revocation) and remove the connection; None
        when there was none. True when the server took the revocation."""
        tokens = await self.vault.get(user, name)
        if tokens is None:
            return None
        revoked = False
        if upstream is not None and upstream.auth is not None and upstream.auth.type == "oauth2_user":
            revoked = await self._revoke_at_server(upstream, tokens)
        await self.vault.delete(user, name)
        await audit(self.vault.redis, "revoke", user, name, self._audit_maxlen, atServer=str(revoked).lower())
        return revoked

    async def _revoke_at_server(self, upstream: Upstream, tokens: TokenSet) -> bool:
        try:
            upstream = await self.resolved(upstream)
            assert upstream.auth is not None
            endpoints = await self.endpoints(upstream)
        except errors.ToolError:
            return False
        if endpoints.revocation_url is None:
            return False
        if tokens.refresh_token:  # revoking the refresh token revokes the grant
            form = {"token": tokens.refresh_token, "token_type_hint": "refresh_token"}
        else:
            form = {"token": tokens.access_token, "token_type_hint": "access_token"}
        client = Client.of(upstream.auth, self.environ)
        timeout_s = AUTHORIZATION_SERVER_TIMEOUT_S
        return await revoke(
            self.transport, client.request(endpoints.revocation_url, form, timeout_s, upstream.verify_tls)
        )

    async def exchange(self, user: str, upstream: Upstream, subject_token: str | None) -> None:
        """Before a call to an `oauth2_token_exchange` upstream is enqueued: the caller's access token
        exchanged for one meant for the upstream, kept in the vault until it expires (unless one is there
        still fresh). A failure is logged; the worker then answers the call 67."""
        auth = upstream.auth
        assert auth is not None and auth.token_url is not None
        current = await self.vault.get(user, upstream.name) if self.enabled else None
        if current is not None and not current.due(time.time()):
            return
        if subject_token is None or not self.enabled:
            return
        try:
            tokens = await self._exchanged(auth, upstream, subject_token)
        except errors.ToolError as exc:
            log.warning("gateway.token_exchange_failed", upstream=upstream.name, user=user, reason=exc.message)
            return
        keep_s = tokens.expires_at - time.time() if tokens.expires_at else None
        await self.vault.put(user, upstream.name, tokens, keep_s=keep_s)

    async def _exchanged(self, auth: Auth, upstream: Upstream, subject_token: str) -> TokenSet:
        assert auth.token_url is not None
        form = {
            "grant_type": TOKEN_EXCHANGE_GRANT,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "requested_token_type": ACCESS_TOKEN_TYPE,
            **({"audience": auth.audience} if auth.audience else {}),
            **({"scope": " ".join(auth.scopes)} if auth.scopes else {}),
            **extra_params(auth, self.environ),
        }
        url = token_url(auth, self.environ)
        client = Client.of(auth, self.environ)
        sent_at = time.time()
        issued = await grant(
            self.transport, client.request(url, form, AUTHORIZATION_SERVER_TIMEOUT_S, upstream.verify_tls)
        )
        return TokenSet(issued.access_token, None, expiry(issued, sent_at), issued.scopes or auth.scopes, sent_at)

    async def close(self) -> None:
        await self.transport.close()


def open_delegation(settings: Settings, redis: aioredis.Redis) -> Delegation:
    """The gateway's vault and the client it reaches authorization servers with."""
    keyring = Keyring.parse(settings.vault_keys.get_secret_value())
    links = ConnectLinks(redis, keyring, settings.public_url, settings.connect_ttl_seconds)
    # Token endpoints are reached as configured; what MCP discovery finds passes the fleet's egress policy.
    policy = EgressPolicy.parse(settings.egress_allow)
    transport = HttpTransport(policy, settings.dns_server_list)
    return Delegation(Vault(redis, keyring), links, transport, settings.audit_stream_maxlen, policy=policy)
