"""An upstream's credentials on a rendered request: its own (bearer, basic, an API key, an OAuth2 token),
or an end user's, taken from a call header the upstream names.

OAuth2 client-credentials tokens are shared by the whole fleet through Redis (this module owns the keys):

    toolworker:oauth:<upstream>:<digest>        the token and when it expires, with a TTL of its lifetime
    toolworker:oauth:<upstream>:<digest>:lock   held (SET NX) by the one worker fetching a token

One worker fetches a token per lifetime; the others wait for it within their call's deadline, and keep
using the current token while it is refreshed, ahead of its expiry. A 401 answer makes the worker fetch
once more (unless another has already), and the call is sent again with the new token.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from urllib.parse import quote, urlencode

import redis.asyncio as aioredis

from worker import errors
from worker.call.circuit import Clock
from worker.call.rendering import render_secret
from worker.call.renewal import REFRESH_AT_SHARE, send_by, single_flight
from worker.definitions.model import Auth, Upstream
from worker.http.oauth import Token, TokenRequest, fetch_token
from worker.http.transport import HttpTransport, PreparedRequest
from worker.protocol import ToolCall

TOKEN_KEY_PREFIX = "toolworker:oauth:"
# Where a call for a user finds the user's token for an upstream (delegated.py's UserTokens.token, the vault):
# (user, upstream, environ, transport, deadline, stale token) -> the access token.
UserToken = Callable[
    [str | None, Upstream, Mapping[str, str], HttpTransport, float, str | None], Awaitable[tuple[str, float]]
]


@dataclass(frozen=True, slots=True)
class CachedToken:
    value: str
    expires_at: float
    refresh_at: float
    obtained_at: float = 0.0

    def fresh(self, stale: str | None, now: float) -> bool:
        return self.value != stale and now < self.refresh_at

    def usable(self, stale: str | None, now: float) -> bool:
        """Whether it may still be sent: it has its send margin of life left."""
        return self.value != stale and now < self.send_by

    @property
    def send_by(self) -> float:
        return send_by(self.obtained_at, self.expires_at)


class TokenCache:
    """The tokens of one worker process: remembered locally, shared with the fleet through Redis.

    `clock` tells wall-clock time (epoch seconds), not monotonic time: expiries and call deadlines are
    shared with other processes.
    """

    def __init__(self, redis: aioredis.Redis | None, clock: Clock = time.time) -> None:
        self._redis = redis
        self._clock = clock
        self._memo: dict[str, CachedToken] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def token(
        self, key: str, fetch: Callable[[], Awaitable[Token]], deadline: float, stale: str | None = None
    ) -> str:
        """A token for `key` that is not `stale` (the one an upstream just refused)."""
        return (await self.cached(key, fetch, deadline, stale)).value

    async def cached(
        self, key: str, fetch: Callable[[], Awaitable[Token]], deadline: float, stale: str | None = None
    ) -> CachedToken:
        """`token`, with its expiry."""
        memo = self._memo.get(key)
        if memo is not None and memo.fresh(stale, self._clock()):
            return memo
        async with self._locks.setdefault(key, asyncio.Lock()):  # one fetch per process at a time
            memo = self._memo.get(key)
            if memo is None or not memo.fresh(stale, self._clock()):
                memo = self._memo[key] = await self._shared(key, fetch, deadline, stale)
        return memo

    async def _shared(
        self, key: str, fetch: Callable[[], Awaitable[Token]], deadline: float, stale: str | None
    ) -> CachedToken:
        if self._redis is None:  # no fleet to share with
            return await self._fetched(fetch)

        async def renew(current: CachedToken | None) -> CachedToken:
            cached = await self._fetched(fetch)
            record = {
                "token": cached.value,
                "expiresAt": cached.expires_at,
                "refreshAt": cached.refresh_at,
                "obtainedAt": cached.obtained_at,
            }
            assert self._redis is not None
            ttl_ms = max(1, int((cached.expires_at - self._clock()) * 1000))
            await self._redis.set(key, json.dumps(record), px=ttl_ms)
            return cached

        return await single_flight(
            self._redis,
            key + ":lock",
            lambda: self._read(key),
            lambda t: t.fresh(stale, self._clock()),
            lambda t: t.usable(stale, self._clock()),
            renew,
            deadline,
            self._clock,
        )

    async def _read(self, key: str) -> CachedToken | None:
        assert self._redis is not None
        raw = await self._redis.get(key)
        if raw is None:
            return None
        data = json.loads(raw)
        return CachedToken(data["token"], data["expiresAt"], data["refreshAt"], data.get("obtainedAt", 0.0))

    async def _fetched(self, fetch: Callable[[], Awaitable[Token]]) -> CachedToken:
        """A new token; its lifetime runs from when its request was sent (the server issued it after that,
        never before: counted from the answer, a slow answer would make it look longer-lived than it is)."""
        sent_at = self._clock()
        token = await fetch()
        lifetime_s = token.expires_in_s
        return CachedToken(token.access_token, sent_at + lifetime_s, sent_at + REFRESH_AT_SHARE * lifetime_s, sent_at)


async def authorize(
    request: PreparedRequest,
    upstream: Upstream,
    call: ToolCall,
    environ: Mapping[str, str],
    tokens: TokenCache,
    deadline: float,
    transport: HttpTransport,
    stale: str | None = None,
    user_token: UserToken | None = None,
) -> tuple[PreparedRequest, str | None]:
    """The request with the upstream's credential on it, and the OAuth2 token used (for a 401's retry)."""
    auth = upstream.auth
    if auth is None:
        return request, None
    env = environ
    if auth.delegated:  # the call's user's own token, from the vault
        if user_token is None:
            raise errors.ToolMisconfigured("This tool acts for its user, and this worker has no vault.")
        token, send_by_at = await user_token(call.user, upstream, env, transport, deadline, stale)
        request = replace(request, credential_send_by=send_by_at)  # checked again just before sending
        return _with_header(request, "Authorization", f"Bearer {token}", token), token
    user = _per_call(auth, call)
    if user is not None:
        return _credential(request, auth, user), None
    if auth.type == "oauth2_client_credentials":
        cached = await tokens.cached(
            _token_key(auth, upstream, env), _fetcher(auth, upstream, env, deadline, transport), deadline, stale
        )
        request = replace(request, credential_send_by=cached.send_by)  # checked again just before sending
        return _with_header(request, "Authorization", f"Bearer {cached.value}", cached.value), cached.value
    return _credential(request, auth, _static(auth, env)), None


def _per_call(auth: Auth, call: ToolCall) -> str | None:
    if auth.per_call_header is None:
        return None
    for name, value in call.headers.items():
        if name.lower() == auth.per_call_header and value.strip():
            return value.strip()
    return None


def _static(auth: Auth, environ: Mapping[str, str]) -> str:
    if auth.type == "basic":
        assert auth.username is not None and auth.password is not None
        pair = f"{render_secret(auth.username, environ)}:{render_secret(auth.password, environ)}"
        return base64.b64encode(pair.encode()).decode()
    template = auth.token if auth.type == "bearer" else auth.value
    if template is None:  # a bearer credential that only calls bring
        raise errors.InvalidArguments(
            f"This tool needs the user's own credential in the call header {auth.per_call_header!r}."
        )
    return render_secret(template, environ)


def _credential(request: PreparedRequest, auth: Auth, secret: str) -> PreparedRequest:
    if auth.type == "api_key" and auth.location == "query":
        separator = "&" if "?" in request.url else "?"
        url = request.url + separator + urlencode({auth.name: secret}, quote_via=quote)
        return replace(request, url=url, secrets=request.secrets | {secret, quote(secret, safe="")})
    if auth.type == "api_key":
        return _with_header(request, auth.name, secret, secret)
    scheme = "Basic" if auth.type == "basic" else "Bearer"
    return _with_header(request, "Authorization", f"{scheme} {secret}", secret)


def _with_header(request: PreparedRequest, name: str, value: str, secret: str) -> PreparedRequest:
    """The credential's header replaces any of the same name the templates set."""
    headers = (*((k, v) for k, v in request.headers if k.lower() != name.lower()), (name, value))
    return replace(
        request,
        headers=headers,
        secrets=request.secrets | {secret, value},
        secret_headers=request.secret_headers | {name.lower()},
    )


def _token_key(auth: Auth, upstream: Upstream, environ: Mapping[str, str]) -> str:
    assert auth.token_url is not None and auth.client_id is not None
    parts = [render_secret(auth.token_url, environ), render_secret(auth.client_id, environ)]
    digest = hashlib.sha256("\x00".join([*parts, auth.scope or "", auth.audience or ""]).encode()).hexdigest()[:16]
    return f"{TOKEN_KEY_PREFIX}{upstream.name}:{digest}"


def _fetcher(
    auth: Auth, upstream: Upstream, environ: Mapping[str, str], deadline: float, transport: HttpTransport
) -> Callable[[], Awaitable[Token]]:
    assert auth.token_url is not None and auth.client_id is not None and auth.client_secret is not None
    client_id, client_secret = render_secret(auth.client_id, environ), render_secret(auth.client_secret, environ)
    form = {"grant_type": "client_credentials"}
    form |= {"scope": auth.scope} if auth.scope else {}
    form |= {"audience": auth.audience} if auth.audience else {}
    form |= {k: render_secret(v, environ) for k, v in auth.extra_params.items()}
    if auth.auth_method == "body":
        form |= {"client_id": client_id, "client_secret": client_secret}
    basic = (client_id, client_secret) if auth.auth_method == "basic" else None
    url = render_secret(auth.token_url, environ)

    async def fetch() -> Token:
        timeout_s = min(upstream.timeout_s, deadline - time.time())
        if timeout_s <= 0:
            raise errors.TimedOut("The call ran out of time before the upstream's access token came.")
        return await fetch_token(transport, TokenRequest(url, form, basic, timeout_s, upstream.verify_tls))

    return fetch
