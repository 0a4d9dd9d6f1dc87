"""Cached answers: a tool's (or its upstream's) `cache:` keeps 2xx envelopes in Redis, shared by the fleet.

The key is a digest of the rendered request (tool, method, URL, body, headers; its `${env:...}` settings and
secrets as their names, so that the gateway, which holds none of them, finds the same key) and of the
identity of the call's own credentials (`credential_identity`), so that no answer made with one user's
credentials is given to another. The upstream's `Cache-Control` is respected: `no-store`, `no-cache` and
`private` keep an answer out; a `max-age` shorter than `ttl_seconds` wins. Workers look up and store
(run.py); the gateway looks up only, and answers a hit without the queue (worker/gateway/calls.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from worker import errors
from worker.call.rendering import render
from worker.constants import KIND_DEFINED
from worker.definitions.model import DELEGATED_AUTH_TYPES, Tool, Upstream
from worker.envelope import ToolResult
from worker.http.transport import PreparedRequest, Response

log = structlog.get_logger("toolworker.cache")

# One string per cached answer (the envelope as JSON, with when it was stored), expiring with its TTL.
CACHE_KEY_PREFIX = "toolworker:cache:"
SHARED_CREDENTIALS = "shared"
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)", re.IGNORECASE)
_NOT_STORED = re.compile(r"(?:^|,)\s*(no-store|no-cache|private)\b", re.IGNORECASE)
# What a cached envelope keeps of the call that stored it: nothing of who asked, or when.
_CALL_FIELDS = ("callId", "tool", "durationMs", "attempts", "cached", "age")


def credential_identity(call_headers: Mapping[str, str], upstream: Upstream, user: str | None) -> str:
    """Whose credentials a call's request carries, as a digest: the call's user where the upstream acts for
    its users (the vault's tokens), the call's own headers that its upstream takes (an end user's token, a
    session's key), else the upstream's shared credentials.

    The one place a call's per-user credentials enter the cache key."""
    taken: list[Any] = sorted((name.lower(), value) for name, value in call_headers.items() if _taken(name, upstream))
    if upstream.auth is not None and upstream.auth.type in DELEGATED_AUTH_TYPES:
        taken.append(("user", user))
    if not taken:
        return SHARED_CREDENTIALS
    return hashlib.sha256(json.dumps(taken, ensure_ascii=False).encode()).hexdigest()


def _taken(name: str, upstream: Upstream) -> bool:
    lower = name.lower()
    per_call = upstream.auth.per_call_header if upstream.auth is not None else None
    return lower in upstream.overridable_headers or lower == per_call


def request_key(tool: Tool, request: PreparedRequest, continuation: Any, identity: str) -> str:
    """The Redis key of the answer to this request (a paginated tool's: from this page on), made with these
    credentials."""
    body = hashlib.sha256(request.body or b"").hexdigest()
    headers = sorted((name.lower(), value) for name, value in request.headers)
    material = [tool.name, request.method, request.url, body, headers, continuation, identity]
    digest = hashlib.sha256(json.dumps(material, ensure_ascii=False, default=str).encode()).hexdigest()
    return f"{CACHE_KEY_PREFIX}{tool.name}:{digest}"


def _named_request(
    tool: Tool, upstream: Upstream, arguments: Mapping[str, Any], call_headers: Mapping[str, str]
) -> tuple[PreparedRequest, Any]:
    """The request with its settings and secrets as their names (the same in the gateway, which has none of
    them, and in every worker), and a paginated tool's continuation argument apart."""
    pagination = tool.pagination
    if pagination is None:
        return render(tool, upstream, arguments, call_headers, {}, placeholders=True), None
    rest = {name: value for name, value in arguments.items() if name != pagination.param}
    return render(tool, upstream, rest, call_headers, {}, placeholders=True), arguments.get(pagination.param)


@dataclass(frozen=True, slots=True)
class Lookup:
    """Where one call's answer is cached, and for how long at most."""

    redis: aioredis.Redis
    key: str
    tool: str
    ttl_s: int

    async def get(self, call_id: str) -> ToolResult | None:
        """The cached envelope, made this call's (`cached: true`, its `age`); None on a miss."""
        try:
            raw = await self.redis.get(self.key)
        except RedisError as exc:  # the cache is an optimisation: without it the call goes upstream
            log.warning("cache.unavailable", error=str(exc))
            raw = None
        if raw is None:
            return None
        stored = json.loads(raw)
        age = max(int(time.time() - stored["storedAt"]), 0)
        fields = {**stored["envelope"], "callId": call_id, "tool": self.tool, "cached": True, "age": age}
        return ToolResult.from_dict(fields)

    async def put(self, envelope: ToolResult, response: Response | None) -> None:
        """Keep a 2xx envelope, for the TTL or the upstream's shorter max-age, unless the upstream said not to."""
        ttl_s = storable_ttl(envelope, response, self.ttl_s)
        if ttl_s is None:
            return
        kept = {k: v for k, v in envelope.to_dict().items() if k not in _CALL_FIELDS}
        value = json.dumps({"envelope": kept, "storedAt": time.time()}, ensure_ascii=False)
        try:
            await self.redis.set(self.key, value, ex=ttl_s)
        except RedisError as exc:
            log.warning("cache.not_stored", error=str(exc))


def storable_ttl(envelope: ToolResult, response: Response | None, ttl_s: int) -> int | None:
    """How long this answer may be kept (None: not at all)."""
    if envelope.exit_code != 0 or response is None or not response.complete:
        return None
    directives = response.cache_control or ""
    if _NOT_STORED.search(directives):
        return None
    max_age = _MAX_AGE.search(directives)
    if max_age is not None:
        ttl_s = min(ttl_s, int(max_age.group(1)))
    return ttl_s if ttl_s > 0 else None


def lookup(
    tool: Tool,
    upstream: Upstream,
    arguments: Mapping[str, Any],
    call_headers: Mapping[str, str],
    redis: aioredis.Redis | None,
    user: str | None = None,
) -> Lookup | None:
    """Where this call's answer is cached (`user`: whom the call acts for); None when the tool is not cached
    (or its method is not), or its request cannot be rendered (the call then runs, and says why)."""
    policy = tool.cache_policy(upstream)
    if redis is None or policy is None or tool.kind != KIND_DEFINED or tool.request.method not in policy.methods:
        return None
    try:
        request, continuation = _named_request(tool, upstream, arguments, call_headers)
        key = request_key(tool, request, continuation, credential_identity(call_headers, upstream, user))
    except (errors.ToolError, RecursionError):  # arguments nested past reason: the worker refuses them
        return None
    return Lookup(redis, key, tool.name, policy.ttl_s)
