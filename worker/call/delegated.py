"""End users' tokens at send time: the call's user's token set for its upstream, from the vault.

    oauth2_user            the set the user granted (connect link → callback); refreshed by one worker of
                           the fleet (renewal.single_flight) once REFRESH_AT_SHARE of its lifetime has passed,
                           and once on a 401. A refresh the server refuses removes the connection (audited).
    oauth2_token_exchange  the token the gateway obtained at enqueue for this user; used until it expires.

No connection (or one no vault key opens) is AuthorizationRequired (67) with a connect link for the user.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from worker import errors
from worker.call.circuit import Clock
from worker.call.connect import ConnectLinks
from worker.call.rendering import render_secret
from worker.call.renewal import single_flight
from worker.call.vault import Keyring, TokenSet, Vault, audit, record_key
from worker.definitions.model import Auth, Upstream
from worker.http.delegated import ClientRejected, ServerEndpoints, discover, expiry, grant
from worker.http.oauth import TokenRequest
from worker.http.transport import HttpTransport


@dataclass(frozen=True, slots=True)
class Client:
    """The gateway's client at an authorization server, as an upstream's `auth:` names it."""

    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    method: str = "body"  # how it authenticates at the token endpoint: "body" or "basic" (HTTP Basic)

    @classmethod
    def of(cls, auth: Auth, environ: Mapping[str, str]) -> Client:
        if auth.client_id is None:
            raise errors.ToolMisconfigured(
                "The upstream names no client_id, and its authorization server offers neither a Client ID Metadata "
                "Document nor dynamic registration (or the gateway's public URL or the vault keys are not set). "
                "Tell the operator."
            )
        secret = render_secret(auth.client_secret, environ) if auth.client_secret is not None else None
        return cls(render_secret(auth.client_id, environ), secret, auth.auth_method)

    def request(self, url: str, form: Mapping[str, str], timeout_s: float, verify_tls: bool) -> TokenRequest:
        """A request to the server's token (or revocation) endpoint, authenticated as this client."""
        if self.method == "basic" and self.client_secret is not None:
            return TokenRequest(url, dict(form), (self.client_id, self.client_secret), timeout_s, verify_tls)
        own = {"client_id": self.client_id, **({"client_secret": self.client_secret} if self.client_secret else {})}
        return TokenRequest(url, {**form, **own}, None, timeout_s, verify_tls)


def extra_params(auth: Auth, environ: Mapping[str, str]) -> dict[str, str]:
    """The `extra_params` of an upstream's auth, rendered (e.g. `resource`, RFC 8707)."""
    return {name: render_secret(value, environ) for name, value in auth.extra_params.items()}


def token_url(auth: Auth, environ: Mapping[str, str]) -> str:
    assert auth.token_url is not None
    return render_secret(auth.token_url, environ)


class Directory:
    """Authorization servers' endpoints by upstream: from `auth:` itself, or discovered once from `issuer`."""

    def __init__(self) -> None:
        self._found: dict[str, ServerEndpoints] = {}

    async def endpoints(
        self, auth: Auth, environ: Mapping[str, str], transport: HttpTransport, timeout_s: float, verify_tls: bool
    ) -> ServerEndpoints:
        revocation = render_secret(auth.revocation_url, environ) if auth.revocation_url is not None else None
        if auth.issuer is None:
            assert auth.authorization_url is not None and auth.token_url is not None
            authorization = render_secret(auth.authorization_url, environ)
            return ServerEndpoints(authorization, render_secret(auth.token_url, environ), revocation)
        found = self._found.get(auth.issuer)
        if found is None:
            found = self._found[auth.issuer] = await discover(transport, auth.issuer, timeout_s, verify_tls)
        if revocation:
            return ServerEndpoints(found.authorization_url, found.token_url, revocation, found.issuer)
        return found


class UserTokens:
    """The vault as the worker's calls read it."""

    def __init__(
        self,
        redis: aioredis.Redis | None,
        keyring: Keyring,
        links: ConnectLinks | None,
        audit_maxlen: int,
        clock: Clock = time.time,
    ) -> None:
        self.vault = Vault(redis, keyring) if redis is not None and keyring else None
        self.keyring = keyring  # also opens the calls' sealed headers (worker/call/call_headers.py)
        self.links = links
        self.directory = Directory()
        self._audit_maxlen = audit_maxlen
        self._clock = clock

    async def token(
        self,
        user: str | None,
        upstream: Upstream,
        environ: Mapping[str, str],
        transport: HttpTransport,
        deadline: float,
        stale: str | None,
    ) -> tuple[str, float]:
        """The user's access token for the upstream, not `stale`, and when it expires (0: unknown);
        AuthorizationRequired without one."""
        auth = upstream.auth
        assert auth is not None
        if self.vault is None:
            raise errors.ToolMisconfigured(
                "This tool acts for its user, and the fleet has no vault keys (TOOLWORKER_VAULT_KEYS). "
                "Tell the operator."
            )
        if user is None:
            raise errors.AuthorizationRequired(
                "This tool acts for a user, and the call names none: call it through the gateway or with `user=`."
            )
        if auth.type == "oauth2_token_exchange":
            return await self._exchanged(user, upstream, stale)
        vault, now = self.vault, self._clock

        async def refresh(current: TokenSet | None) -> TokenSet:
            return await self._refresh(user, upstream, environ, transport, deadline, current)

        tokens = await single_flight(
            vault.redis,
            record_key(user, upstream.name) + ":lock",
            lambda: vault.get(user, upstream.name),
            lambda t: t.access_token != stale and not t.due(now()),
            lambda t: t.access_token != stale and t.usable(now()),
            refresh,
            deadline,
            now,
        )
        return tokens.access_token, tokens.send_by

    async def _exchanged(self, user: str, upstream: Upstream, stale: str | None) -> tuple[str, float]:
        assert self.vault is not None
        tokens = await self.vault.get(user, upstream.name)
        if tokens is None or tokens.access_token == stale or not tokens.usable(self._clock()):
            raise errors.AuthorizationRequired(
                "This tool needs the caller's access token exchanged for one of this upstream's, which the gateway "
                "does when an OAuth-authenticated caller calls the tool. Call it again through the gateway."
            )
        return tokens.access_token, tokens.send_by

    async def _refresh(
        self,
        user: str,
        upstream: Upstream,
        environ: Mapping[str, str],
        transport: HttpTransport,
        deadline: float,
        current: TokenSet | None,
    ) -> TokenSet:
        """A new token set from the refresh token (this worker holds the fleet's lock for it)."""
        assert self.vault is not None and upstream.auth is not None
        if current is None:
            raise await self.required(user, upstream.name)
        if current.refresh_token is None:
            await self.vault.delete(user, upstream.name)
            raise await self.required(user, upstream.name, "The user's authorization for it has expired. ")
        auth, timeout_s = upstream.auth, min(upstream.timeout_s, deadline - self._clock())
        if timeout_s <= 0:
            raise errors.TimedOut("The call ran out of time before the user's token was refreshed.")
        endpoints = await self.directory.endpoints(auth, environ, transport, timeout_s, upstream.verify_tls)
        form = {"grant_type": "refresh_token", "refresh_token": current.refresh_token, **extra_params(auth, environ)}
        request = Client.of(auth, environ).request(endpoints.token_url, form, timeout_s, upstream.verify_tls)
        sent_at = self._clock()
        try:
            issued = await grant(transport, request)
        except errors.AuthorizationRequired as exc:
            if isinstance(exc, ClientRejected):  # a registration the server dropped: registered anew
                from worker.call.mcp_clients import forget_registrations  # the MCP SDK: loaded when needed

                await forget_registrations(self.vault.redis, upstream.name)
            await self.vault.delete(user, upstream.name)
            await audit(self.vault.redis, "refresh_failed", user, upstream.name, self._audit_maxlen)
            raise await self.required(user, upstream.name, "The authorization server no longer honours it. ") from None
        scopes = issued.scopes or current.scopes
        refresh = issued.refresh_token or current.refresh_token
        tokens = TokenSet(issued.access_token, refresh, expiry(issued, sent_at), scopes, sent_at, current.asked)
        await self.vault.put(user, upstream.name, tokens)
        return tokens

    async def required(
        self, user: str, upstream: str, why: str = "", scopes: tuple[str, ...] = ()
    ) -> errors.AuthorizationRequired:
        """67 for a user without a connection (or whose grant lacks `scopes`), with a link to connect."""
        message = f"This tool acts for the user {user!r}, who has not connected {upstream!r}. {why}"
        if scopes:
            message = f"This tool acts for the user {user!r}, whose grant for {upstream!r} is not enough. {why}"
        if self.links is None:
            return errors.AuthorizationRequired(message + "Ask the operator how to connect it.")
        link = await self.links.link(user, upstream, scopes)
        return errors.AuthorizationRequired(
            message + f"Ask the user to open this link to grant access, then call the tool again: {link}"
        )
