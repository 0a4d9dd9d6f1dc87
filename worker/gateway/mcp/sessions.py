"""The `initialize` handshake of 2025-11-25 (and earlier) clients, remembered without a stateful process.

The HTTP endpoint is stateless (any gateway process answers any request), yet what a client declared in
`initialize` - its protocol version, who it is, its capabilities (elicitation in form or URL mode,
sampling, roots, tasks) - decides how it may be asked. So the answer to `initialize` carries an
`Mcp-Session-Id`, and the handshake is kept in Redis under it, where every process of the deployment finds
it:

    toolworker:gateway:mcp-session:<sha256 of the id>   JSON {principal, protocolVersion, clientInfo,
                                                         capabilities}; expires SESSION_TTL_S after its
                                                         last use

Redis rather than a signed id: a capabilities object has no size bound worth putting in every request's
header, a session can be ended (DELETE) before it expires, and no signing key has to be shared and rotated
across processes: another deployment's Redis simply does not know the id. The id is 32 random bytes; only
its digest is stored. A request with an id that is unknown, expired, ended or another principal's is
answered 404, as Streamable HTTP requires, and the client starts a new session. A GET (the standalone event
stream) is 405: nothing is sent to these clients unasked, and no stream need stand open per client and
process. 2026-07-28 clients send no `initialize` and get no session: each of their requests says what it
needs. A POSTed JSON-RPC response of a session is a client's answer to a request sent on one of its calls'
streams: it is handed to back_channel.py (202), and a `tools/call` of a client that declared elicitation
gets a back channel to be asked on.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, replace
from typing import Any

import mcp_types as types
import redis.asyncio as aioredis
from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.gateway.identity.principals import principal_of
from worker.gateway.identity.security import BODY_SCOPE_KEY
from worker.gateway.mcp.back_channel import BACK_CHANNEL_SCOPE_KEY, Channel, Replies, is_reply

SESSION_KEY_PREFIX = "toolworker:gateway:mcp-session:"
SESSION_HEADER = "mcp-session-id"
# The handshake of the request's session, when it has one (the SDK's request context reaches the scope).
HANDSHAKE_SCOPE_KEY = "toolworker.mcp_handshake"
SESSION_TTL_S = 24 * 3600
_ID_BYTES = 32


@dataclass(frozen=True)
class Handshake:
    """What a client declared in `initialize`."""

    protocol_version: str
    client_info: dict[str, Any]
    capabilities: types.ClientCapabilities
    # What the client set with `logging/setLevel` since (relay.py); None: it hears no log messages.
    log_level: str | None = None

    def encode(self, principal: str) -> str:
        return json.dumps(
            {
                "principal": principal,
                "protocolVersion": self.protocol_version,
                "clientInfo": self.client_info,
                "capabilities": self.capabilities.model_dump(mode="json", by_alias=True, exclude_none=True),
                **({"logLevel": self.log_level} if self.log_level is not None else {}),
            }
        )

    @classmethod
    def of(cls, params: dict[str, Any]) -> Handshake | None:
        """The handshake of `initialize` params; None when they are not what the protocol says."""
        version, info = params.get("protocolVersion"), params.get("clientInfo")
        try:
            capabilities = types.ClientCapabilities.model_validate(params.get("capabilities") or {})
        except ValidationError:
            return None
        if not isinstance(version, str) or not isinstance(info, dict):
            return None
        level = params.get("logLevel")
        return cls(version, info, capabilities, level if isinstance(level, str) else None)


class Handshakes:
    """The handshakes of the deployment's sessions, in Redis."""

    def __init__(self, redis: aioredis.Redis, ttl_s: int = SESSION_TTL_S) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def remember(self, handshake: Handshake, principal: str) -> str:
        """A new session for this handshake: its id."""
        session_id = secrets.token_urlsafe(_ID_BYTES)
        await self._redis.set(_key(session_id), handshake.encode(principal), ex=self._ttl_s)
        return session_id

    async def recall(self, session_id: str, principal: str) -> Handshake | None:
        """The session's handshake, its life extended; None when unknown, expired, ended or another's."""
        raw = await self._redis.getex(_key(session_id), ex=self._ttl_s)
        if raw is None:
            return None
        stored = json.loads(raw)
        if not secrets.compare_digest(str(stored.get("principal")).encode(), principal.encode()):
            return None
        return Handshake.of(stored)

    async def forget(self, session_id: str) -> None:
        await self._redis.delete(_key(session_id))

    async def set_log_level(self, session_id: str, principal: str, level: str) -> None:
        """The session's `logging/setLevel` (its calls relay their upstreams' log messages at or above it)."""
        handshake = await self.recall(session_id, principal)
        if handshake is not None:
            updated = replace(handshake, log_level=level)
            await self._redis.set(_key(session_id), updated.encode(principal), ex=self._ttl_s)


class McpSessions:
    """In front of the SDK's stateless transport: gives an `initialize` answer its session id, and hands
    each later request of the session its handshake (or answers 404)."""

    def __init__(self, handshakes: Handshakes, replies: Replies) -> None:
        self.handshakes = handshakes
        self.replies = replies

    async def __call__(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        session_id = _header(scope, SESSION_HEADER)
        principal = principal_of(scope).name
        if session_id is None:
            handshake = _initialize(scope)
            if handshake is None:
                return await app(scope, receive, send)
            session_id = await self.handshakes.remember(handshake, principal)
            return await app(scope, receive, _with_session(send, session_id))
        handshake = await self.handshakes.recall(session_id, principal)
        if handshake is None:
            return await _unknown_session(scope, receive, send)
        if scope["method"] == "DELETE":  # the client ends its session
            await self.handshakes.forget(session_id)
            return await JSONResponse(None, status_code=200)(scope, receive, send)
        if scope["method"] == "GET":  # no standing stream: nothing is sent to these clients unasked
            return await _no_stream(scope, receive, send)
        scope[HANDSHAKE_SCOPE_KEY] = handshake
        message = _message(scope)
        if is_reply(message):  # an answer to a request sent on a call's stream, maybe by another process
            await self.replies.deliver(session_id, message)
            return await JSONResponse(None, status_code=202)(scope, receive, send)
        if _can_be_asked(handshake, message):
            scope[BACK_CHANNEL_SCOPE_KEY] = Channel(session_id, self.replies)
        await app(scope, receive, send)


def handshake_of(scope: Scope) -> Handshake | None:
    """The handshake of the request's session, if it has one."""
    found = scope.get(HANDSHAKE_SCOPE_KEY)
    return found if isinstance(found, Handshake) else None


def _message(scope: Scope) -> Any:
    """The POSTed JSON-RPC message (None when not one)."""
    try:
        return json.loads(scope.get(BODY_SCOPE_KEY, b"")) if scope["method"] == "POST" else None
    except ValueError:
        return None


def _can_be_asked(handshake: Handshake, message: Any) -> bool:
    """A `tools/call` whose client declared elicitation or sampling: it may be asked on the call's stream
    (approval, consent, an MCP upstream's own requests: relay.py)."""
    called = isinstance(message, dict) and message.get("method") == "tools/call"
    capabilities = handshake.capabilities
    return called and (capabilities.elicitation is not None or capabilities.sampling is not None)


def _key(session_id: str) -> str:
    return SESSION_KEY_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope.get("headers", ()):
        if key.lower() == wanted:
            return str(value.decode("latin-1"))
    return None


def _initialize(scope: Scope) -> Handshake | None:
    """The handshake an `initialize` request declares; None for any other request."""
    if scope["method"] != "POST":
        return None
    body = scope.get(BODY_SCOPE_KEY, b"")
    if b'"initialize"' not in body:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    return Handshake.of(params) if isinstance(params, dict) else None


def _with_session(send: Send, session_id: str) -> Send:
    """`send`, with the session id on a successful answer."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and message.get("status") == 200:
            headers = [*message.get("headers", []), (SESSION_HEADER.encode(), session_id.encode())]
            message = {**message, "headers": headers}
        await send(message)

    return sending


async def _no_stream(scope: Scope, receive: Receive, send: Send) -> None:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "No event stream at GET"}}
    await JSONResponse(body, status_code=405, headers={"Allow": "POST, DELETE"})(scope, receive, send)


async def _unknown_session(scope: Scope, receive: Receive, send: Send) -> None:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}
    await JSONResponse(body, status_code=404)(scope, receive, send)
