"""The vault: end users' token sets, one per (user, upstream), in Redis, encrypted at rest (AES-GCM).

    toolworker:vault:conn:<upstream>:<user digest>   {"kid", "nonce", "data"}: the token set, sealed
    toolworker:vault:user:<user digest>              the upstreams a user has connected (a set)
    toolworker:mcp:lister:<upstream>                 the user whose token lists an MCP upstream that wants a
                                                     user's token even for that: the first who connected it
                                                     (a name, never a token); forgotten with their connection

The keys come from TOOLWORKER_VAULT_KEYS (`kid:BASE64(32 bytes)`, comma-separated; worker/sealing.py holds
the keyring): the first seals, every one opens. A rotation puts a new key in front: a record sealed with an
older key is resealed with the new one the next time it is read, and the old key can go once no record
names it. Each record names the key that sealed it, and is sealed with its own Redis key as associated
data: a record copied under another user's key does not open. A record no key opens is no connection (and
is logged). Nothing here is ever logged, queued or published.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

import redis.asyncio as aioredis
import structlog
from redis.typing import EncodableT, FieldT

from worker.call.renewal import REFRESH_AT_SHARE, send_by
from worker.constants import AUDIT_STREAM_KEY
from worker.sealing import Keyring as Keyring
from worker.sealing import VaultKeyError as VaultKeyError
from worker.sealing import VaultLocked as VaultLocked

log = structlog.get_logger("toolworker.vault")

VAULT_KEY_PREFIX = "toolworker:vault:conn:"
VAULT_USER_KEY_PREFIX = "toolworker:vault:user:"
LISTER_KEY_PREFIX = "toolworker:mcp:lister:"
# Deletes the lister's key only when it names this user (another user who became the lister keeps it).
_FORGET_LISTER = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


@dataclass(frozen=True, slots=True)
class TokenSet:
    """What a user granted for one upstream. `expires_at` is epoch seconds (0: the server did not say)."""

    access_token: str = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_at: float = 0.0
    scopes: tuple[str, ...] = ()
    obtained_at: float = 0.0
    # The scopes the user's consent asked for (the server may grant fewer): a step-up asks for no scope twice.
    asked: tuple[str, ...] = ()

    def refresh_at(self, share: float) -> float:
        """When to refresh: once `share` of its lifetime has passed (never, for a token without expiry)."""
        if not self.expires_at:
            return float("inf")
        return self.obtained_at + share * (self.expires_at - self.obtained_at)

    def due(self, now: float) -> bool:
        """Whether it is time to refresh (or exchange) it again."""
        return now >= self.refresh_at(REFRESH_AT_SHARE)

    def usable(self, now: float) -> bool:
        """Whether it may still be sent: it has its send margin of life left (or never expires)."""
        return not self.expires_at or now < self.send_by

    @property
    def send_by(self) -> float:
        """The last moment it may be sent (0: no expiry)."""
        return send_by(self.obtained_at, self.expires_at) if self.expires_at else 0.0

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> TokenSet:
        raw = json.loads(data)
        return cls(
            raw["access_token"], raw.get("refresh_token"), float(raw.get("expires_at") or 0),
            tuple(raw.get("scopes") or ()), float(raw.get("obtained_at") or 0), tuple(raw.get("asked") or ()),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Connection:
    """A connection as anyone may see it: never a token."""

    upstream: str
    scopes: tuple[str, ...]
    expires_at: float

    def to_dict(self) -> dict[str, object]:
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires_at)) if self.expires_at else None
        return {"upstream": self.upstream, "scopes": list(self.scopes), "expiresAt": expires}


def user_digest(user: str) -> str:
    return hashlib.sha256(user.encode()).hexdigest()[:32]


def record_key(user: str, upstream: str) -> str:
    return f"{VAULT_KEY_PREFIX}{upstream}:{user_digest(user)}"


class Vault:
    """Token sets by (user, upstream), sealed with the keyring."""

    def __init__(self, redis: aioredis.Redis, keyring: Keyring) -> None:
        self.redis = redis
        self.keyring = keyring

    async def get(self, user: str, upstream: str) -> TokenSet | None:
        key = record_key(user, upstream)
        sealed = await self.redis.get(key)
        if sealed is None:
            return None
        plaintext = self.keyring.open(sealed, key)
        if plaintext is None:
            return None
        if not self.keyring.sealed_with_current(sealed):  # a rotation: sealed again with the first key
            await self.redis.set(key, self.keyring.seal(plaintext, key), keepttl=True, xx=True)
        return TokenSet.decode(plaintext)

    async def put(self, user: str, upstream: str, tokens: TokenSet, keep_s: float | None = None) -> None:
        """Store the set; `keep_s` bounds how long (an exchanged token is kept until it expires)."""
        key = record_key(user, upstream)
        sealed = self.keyring.seal(tokens.encode(), key)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(key, sealed, px=None if keep_s is None else max(1, int(keep_s * 1000)))
            pipe.sadd(VAULT_USER_KEY_PREFIX + user_digest(user), upstream)
            await pipe.execute()

    async def delete(self, user: str, upstream: str) -> bool:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(record_key(user, upstream))
            pipe.srem(VAULT_USER_KEY_PREFIX + user_digest(user), upstream)
            pipe.eval(_FORGET_LISTER, 1, LISTER_KEY_PREFIX + upstream, user)
            removed, _, _ = await pipe.execute()
        return bool(removed)

    async def connections(self, user: str) -> list[Connection]:
        """The user's connections that a key opens, by upstream name."""
        found = []
        for raw in sorted(await self.redis.smembers(VAULT_USER_KEY_PREFIX + user_digest(user))):
            upstream = raw.decode() if isinstance(raw, bytes) else raw
            tokens = await self.get(user, upstream)
            if tokens is not None:
                found.append(Connection(upstream, tokens.scopes, tokens.expires_at))
        return found


async def remember_lister(redis: aioredis.Redis, upstream: str, user: str) -> bool:
    """`user` connected `upstream`: they list it from now on unless someone else does already (True: they do)."""
    return bool(await redis.set(LISTER_KEY_PREFIX + upstream, user, nx=True))


async def lister(redis: aioredis.Redis, upstream: str) -> str | None:
    """The user whose token lists `upstream` (None: no one connected it, or they disconnected)."""
    raw = await redis.get(LISTER_KEY_PREFIX + upstream)
    return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)


async def audit(redis: aioredis.Redis, event: str, user: str, upstream: str, maxlen: int, **extra: str) -> None:
    """A connection's event in the audit trail (connect, refresh_failed, revoke): who, which upstream,
    never a token."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
    fields: dict[FieldT, EncodableT] = {"time": now, "event": event, "principal": user, "upstream": upstream}
    fields.update(extra.items())
    log.info("vault.connection", action=event, principal=user, upstream=upstream, **extra)
    try:
        await redis.xadd(AUDIT_STREAM_KEY, fields, maxlen=maxlen, approximate=True)
    except Exception as exc:  # the log line above is the record of last resort
        log.warning("vault.audit_not_written", event=event, error=str(exc))
