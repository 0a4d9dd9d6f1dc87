"""What every HTTP request passes before a route sees it: bearer tokens, the Origin of `/mcp`, body caps.

- Tokens (`TOOLWORKER_GATEWAY_TOKENS`) are compared in constant time, each of them every time. Without
  tokens the gateway serves loopback only (app.py binds it so); `/healthz` needs no token (probes).
- A browser page may reach `/mcp` only from an allowed Origin (DNS rebinding, drive-by pages); a
  request without Origin (not a browser) passes.
- A body larger than `TOOLWORKER_GATEWAY_MAX_BODY_BYTES` is refused (413) before any route reads it.
Refusals are JSON `{"error": {"type", "message"}}`; nothing of the request is echoed.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

OPEN_PATHS = frozenset({"/healthz"})
# The request body, as the Guard read it, for the /mcp endpoint to look at (ASGI scopes take custom keys).
BODY_SCOPE_KEY = "toolworker.body"
LOOPBACK_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def error_body(kind: str, message: str) -> bytes:
    return json.dumps({"error": {"type": kind, "message": message}}).encode()


async def send_json(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """Pure ASGI middleware (no per-request task or copy beyond the body it must measure)."""

    def __init__(
        self,
        app: ASGIApp,
        tokens: list[str],
        allowed_origins: list[str],
        max_body_bytes: int,
        mcp: ASGIApp | None = None,
    ) -> None:
        self.app = app
        # /mcp goes straight to the SDK's transport, without Starlette's routing (its body in the scope).
        self.mcp = mcp
        self.tokens = [t.encode() for t in tokens]
        self.origins = allowed_origins or list(LOOPBACK_ORIGINS)
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, kind, message, extra = refusal
            await send_json(send, status, error_body(kind, message), extra)
            return
        body = await self._body(scope, receive)
        if body is None:
            await send_json(send, 413, error_body("too_large", f"The body is over {self.max_body_bytes} bytes."))
            return
        if self.mcp is not None and scope["path"] == "/mcp":
            scope[BODY_SCOPE_KEY] = b"".join(m.get("body", b"") for m in body if m["type"] == "http.request")
            await self.mcp(scope, _replay(body, receive), send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str, list[tuple[bytes, bytes]]] | None:
        headers = dict(scope["headers"])
        path: str = scope["path"]
        if self.tokens and path not in OPEN_PATHS and not self._authorized(headers.get(b"authorization", b"")):
            challenge = [(b"www-authenticate", b'Bearer realm="toolworker"')]
            return 401, "unauthorized", "A valid bearer token is required (Authorization: Bearer ...).", challenge
        origin = headers.get(b"origin")
        if path.startswith("/mcp") and origin is not None and not self._origin_allowed(origin.decode("latin-1")):
            return 403, "forbidden_origin", "Requests from this Origin are not allowed.", []
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return 413, "too_large", f"The body is over {self.max_body_bytes} bytes.", []
        return None

    def _authorized(self, header: bytes) -> bool:
        scheme, _, given = header.partition(b" ")
        matched = False
        for token in self.tokens:  # every token compared, whichever matches
            matched |= hmac.compare_digest(given.strip(), token)
        return scheme.lower() == b"bearer" and matched

    def _origin_allowed(self, origin: str) -> bool:
        for allowed in self.origins:
            if origin == allowed or (allowed.endswith(":*") and _same_host(origin, allowed[:-2])):
                return True
        return False

    async def _body(self, scope: Scope, receive: Receive) -> list[Message] | None:
        """The request's body messages, or None when they add up to more than the cap."""
        if scope["method"] in {"GET", "HEAD", "DELETE", "OPTIONS"} and not _has_body(scope):
            return []
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return messages


def _same_host(origin: str, base: str) -> bool:
    return origin == base or (origin.startswith(base + ":") and origin[len(base) + 1 :].isdigit())


def _has_body(scope: Scope) -> bool:
    headers = dict(scope["headers"])
    return headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def origins(setting: str) -> list[str]:
    return [o.strip().rstrip("/") for o in setting.split(",") if o.strip()]
