"""Connect links and the authorizations they start: how a user grants an upstream access (consent).

    toolworker:vault:ticket:<sha256 of the ticket>   {user, upstream, scopes}, sealed; single use, expiring
    toolworker:vault:state:<sha256 of the state>     {user, upstream, PKCE verifier, browser binding, scopes}, sealed

A link `{gateway}/v1/connections/{upstream}/authorize?ticket=...` is made for one user and one upstream (by
a worker answering 67, or the gateway asking over MCP). Opening it spends the ticket and starts an
authorization (for the link's own scopes, when a step-up named them; else the upstream's): a fresh `state` and
PKCE verifier kept here, bound to the browser that opened it (a cookie
whose digest the record holds), for as long as the link was valid. The callback spends the state. Only
digests name the keys, and the records are sealed with the vault's keys: nothing in Redis opens a link or
finishes an authorization.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import redis.asyncio as aioredis

from worker.call.vault import Keyring

TICKET_KEY_PREFIX = "toolworker:vault:ticket:"
STATE_KEY_PREFIX = "toolworker:vault:state:"
CALLBACK_PATH = "/v1/connections/callback"


@dataclass(frozen=True, slots=True)
class Pending:
    """An authorization under way, as the callback finds it."""

    user: str
    upstream: str
    verifier: str = field(repr=False)
    binding_digest: str = field(repr=False)
    expires_at: float
    scopes: tuple[str, ...] = ()  # what the authorization asked for

    def bound_to(self, binding: str | None) -> bool:
        return binding is not None and hmac.compare_digest(_digest(binding), self.binding_digest)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ConnectLinks:
    def __init__(self, redis: aioredis.Redis, keyring: Keyring, public_url: str, ttl_s: int) -> None:
        self._redis = redis
        self._keyring = keyring
        self.public_url = public_url.rstrip("/")
        self.ttl_s = ttl_s

    @property
    def redirect_uri(self) -> str:
        return self.public_url + CALLBACK_PATH

    async def link(self, user: str, upstream: str, scopes: tuple[str, ...] = ()) -> str:
        """A new single-use connect URL for `user` and `upstream` (asking for `scopes`, when given)."""
        ticket = secrets.token_urlsafe(32)
        record = {"user": user, "upstream": upstream, "expiresAt": time.time() + self.ttl_s, "scopes": list(scopes)}
        await self._put(TICKET_KEY_PREFIX + _digest(ticket), record, self.ttl_s)
        return f"{self.public_url}/v1/connections/{quote(upstream, safe='')}/authorize?ticket={ticket}"

    async def redeem(self, ticket: str, upstream: str) -> tuple[str, float, tuple[str, ...]] | None:
        """The user a ticket was made for, when it expires and the scopes it asks for (none: the upstream's);
        None when unknown, spent, expired, or made for another upstream. Spent either way."""
        record = await self._take(TICKET_KEY_PREFIX + _digest(ticket))
        if record is None or record.get("upstream") != upstream or record.get("expiresAt", 0) <= time.time():
            return None
        return str(record["user"]), float(record["expiresAt"]), tuple(record.get("scopes") or ())

    async def begin(
        self, user: str, upstream: str, verifier: str, binding: str, expires_at: float, scopes: tuple[str, ...] = ()
    ) -> str:
        """A new `state` for an authorization asking for `scopes` (kept until the link would have expired)."""
        state = secrets.token_urlsafe(32)
        record = {
            "user": user, "upstream": upstream, "verifier": verifier,
            "binding": _digest(binding), "expiresAt": expires_at, "scopes": list(scopes),
        }  # fmt: skip
        await self._put(STATE_KEY_PREFIX + _digest(state), record, max(1, int(expires_at - time.time()) + 1))
        return state

    async def finish(self, state: str) -> Pending | None:
        """The authorization a state names, spent; None when unknown, spent or expired."""
        record = await self._take(STATE_KEY_PREFIX + _digest(state))
        if record is None or record.get("expiresAt", 0) <= time.time():
            return None
        scopes = tuple(record.get("scopes") or ())
        return Pending(
            record["user"], record["upstream"], record["verifier"], record["binding"], record["expiresAt"], scopes
        )

    async def _put(self, key: str, record: dict[str, object], ttl_s: int) -> None:
        await self._redis.set(key, self._keyring.seal(json.dumps(record).encode(), key), ex=ttl_s)

    async def _take(self, key: str) -> dict[str, Any] | None:
        sealed = await self._redis.getdel(key)
        plaintext = None if sealed is None else self._keyring.open(sealed, key)
        if plaintext is None:
            return None
        record = json.loads(plaintext)
        return record if isinstance(record, dict) else None
