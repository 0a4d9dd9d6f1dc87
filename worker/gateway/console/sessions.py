"""Console sessions, kept in Redis: the cookie carries an opaque id, Redis a digest of it.

    toolworker:console:session:<sha256 of the id>   JSON {principal, tenant, tools, tags, actions, csrf};
                                                    expires after TOOLWORKER_CONSOLE_SESSION_TTL_SECONDS
                                                    without use

The id never reaches Redis (a copy of the database signs no one in), nor any page; the CSRF token is a
second random value, shown in forms and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

import redis.asyncio as aioredis

from worker.gateway.identity.principals import Grant, Principal

SESSION_PREFIX = "toolworker:console:session:"
COOKIE = "toolworker_console"
# Before sign-in: the login form's CSRF token, as a cookie of its own (double submit: no session yet).
LOGIN_COOKIE = "toolworker_console_login"
CSRF_FIELD = "csrf_token"
_ID_BYTES = 32


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf: str

    def csrf_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.csrf.encode())


def new_secret() -> str:
    return secrets.token_urlsafe(_ID_BYTES)


def _key(session_id: str) -> str:
    return SESSION_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    def __init__(self, redis: aioredis.Redis, ttl_s: int) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def open(self, principal: Principal) -> tuple[str, Session]:
        """A new session for `principal`: its id (for the cookie only) and the session."""
        session_id, session = new_secret(), Session(principal, new_secret())
        await self._redis.set(_key(session_id), _dump(session), ex=self._ttl_s)
        return session_id, session

    async def find(self, session_id: str | None) -> Session | None:
        """The session this id names, its expiry renewed; None when there is none (or it ended)."""
        if not session_id or len(session_id) > 128:
            return None
        raw = await self._redis.getex(_key(session_id), ex=self._ttl_s)
        return None if raw is None else _load(raw)

    async def close(self, session_id: str) -> None:
        await self._redis.delete(_key(session_id))


def _dump(session: Session) -> str:
    who = session.principal
    grant = {"tools": sorted(who.grant.tools), "tags": sorted(who.grant.tags), "actions": sorted(who.grant.actions)}
    return json.dumps({"principal": who.name, "tenant": who.tenant, **grant, "csrf": session.csrf})


def _load(raw: bytes | str) -> Session:
    data = json.loads(raw)
    grant = Grant(frozenset(data["tools"]), frozenset(data["tags"]), frozenset(data["actions"]))
    return Session(Principal(data["principal"], data["tenant"], grant), data["csrf"])
