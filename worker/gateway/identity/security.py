"""What every HTTP request passes before a route sees it: who calls (bearer tokens), the Origin of `/mcp`,
body caps.

- A bearer token names a principal (principals.py): a static token, compared in constant time with each of
  them every time, or an OAuth 2.1 access token (oauth.py). The principal rides in the request's scope for
  the routes. A 401 says where to get a token (`WWW-Authenticate: Bearer resource_metadata=...`, RFC 9728,
  with `error="invalid_token"` when one was given); a valid access token whose scopes grant no tool is a
  403 `insufficient_scope`. Without tokens the gateway serves loopback only (app.py binds it so);
  `/healthz` and the Protected Resource Metadata need no token; nor does `/console`, whose pages check a
  session of their own (gateway/console/gate.py).
- A connect link and the OAuth callback (rest/connections.py) are a browser's, without a bearer token.
- A browser page may reach `/mcp` only from an allowed Origin (DNS rebinding, drive-by pages); a
  request without Origin (not a browser) passes.
- A body larger than `TOOLWORKER_GATEWAY_MAX_BODY_BYTES` is refused (413) before any route reads it.
Refusals are JSON `{"error": {"type", "message"}}`; nothing of the request is echoed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.call.connect import CALLBACK_PATH
from worker.gateway.identity.oauth import WELL_KNOWN_RESOURCE_PATH, InvalidToken, IssuerUnavailable, JwtVerifier
from worker.gateway.identity.principals import ACCESS_TOKEN_SCOPE_KEY, PRINCIPAL_SCOPE_KEY, Principal, StaticTokens

OPEN_PATHS = frozenset({"/healthz"})
# The operators' console signs its users in with a session of its own (gateway/console/): no bearer token.
CONSOLE_PREFIX = "/console"
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


Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Refusal:
    status: int
    kind: str
    message: str
    headers: Headers


class Gatekeeper:
    """The principal a request's `Authorization: Bearer` names, or why it names none."""

    def __init__(
        self, tokens: StaticTokens, verifier: JwtVerifier | None = None, resource_metadata_url: str | None = None
    ) -> None:
        self.tokens = tokens
        self.verifier = verifier
        self.resource_metadata_url = resource_metadata_url

    @property
    def required(self) -> bool:
        return bool(self.tokens) or self.verifier is not None

    async def admit(self, header: bytes) -> Principal | Refusal:
        return (await self.identify(header))[0]

    async def identify(self, header: bytes) -> tuple[Principal | Refusal, str | None]:
        """The principal (or the refusal), and the OAuth access token when it was one."""
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            refusal = self._refusal(
                401, "unauthorized", "A valid bearer token is required (Authorization: Bearer ...)."
            )
            return refusal, None
        token = given.strip()
        principal, access_token = self.tokens.match(token), None
        if principal is None and self.verifier is not None:
            try:
                access_token = token.decode("latin-1")
                principal = await self.verifier.principal(access_token)
            except IssuerUnavailable as exc:  # not the token's fault: the client may try again later
                return Refusal(503, "unavailable", str(exc), [(b"retry-after", b"10")]), None
            except InvalidToken as exc:
                return self._refusal(401, "invalid_token", str(exc), error="invalid_token"), None
        if principal is None:
            return self._refusal(401, "invalid_token", "The bearer token is not valid.", error="invalid_token"), None
        if principal.grant.empty:
            refusal = self._refusal(403, "insufficient_scope", "The token grants no tool.", error="insufficient_scope")
            return refusal, None
        return principal, access_token

    def _refusal(self, status: int, kind: str, message: str, error: str | None = None) -> Refusal:
        return Refusal(status, kind, message, [(b"www-authenticate", self._challenge(message, error).encode())])

    def _challenge(self, message: str, error: str | None) -> str:
        """RFC 6750 §3 (with RFC 9728's resource_metadata): quoted values without quotes or backslashes."""
        params = ['realm="toolworker"']
        if error is not None:
            params += [f'error="{error}"', f'error_description="{_quotable(message)}"']
        if self.verifier is not None and self.verifier.spec.scopes:  # RFC 6750 §3: the scopes to ask for
            params.append(f'scope="{" ".join(sorted(self.verifier.spec.scopes))}"')
        if self.resource_metadata_url is not None:
            params.append(f'resource_metadata="{self.resource_metadata_url}"')
        return "Bearer " + ", ".join(params)


def _quotable(text: str) -> str:
    return "".join(c for c in text if c not in '"\\' and 32 <= ord(c) < 127)


class Guard:
    """Pure ASGI middleware (no per-request task or copy beyond the body it must measure)."""

    def __init__(
        self,
        app: ASGIApp,
        gatekeeper: Gatekeeper,
        allowed_origins: list[str],
        max_body_bytes: int,
        mcp: ASGIApp | None = None,
    ) -> None:
        self.app = app
        # /mcp goes straight to the SDK's transport, without Starlette's routing (its body in the scope).
        self.mcp = mcp
        self.gatekeeper = gatekeeper
        self.origins = allowed_origins or list(LOOPBACK_ORIGINS)
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = await self._identify(scope) or self._refusal(scope)
        if refusal is not None:
            await send_json(send, refusal.status, error_body(refusal.kind, refusal.message), refusal.headers)
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

    async def _identify(self, scope: Scope) -> Refusal | None:
        """The request's principal into its scope; a refusal when it has none and needs one."""
        path: str = scope["path"]
        if not self.gatekeeper.required or path in OPEN_PATHS or path.startswith(WELL_KNOWN_RESOURCE_PATH):
            return None
        if is_open_path(path):  # the console (sessions of its own), a connect link, the OAuth callback
            return None
        admitted, access_token = await self.gatekeeper.identify(dict(scope["headers"]).get(b"authorization", b""))
        if isinstance(admitted, Refusal):
            return admitted
        scope[PRINCIPAL_SCOPE_KEY] = admitted
        if access_token is not None:
            scope[ACCESS_TOKEN_SCOPE_KEY] = access_token
        return None

    def _refusal(self, scope: Scope) -> Refusal | None:
        headers = dict(scope["headers"])
        path: str = scope["path"]
        origin = headers.get(b"origin")
        if path.startswith("/mcp") and origin is not None and not self._origin_allowed(origin.decode("latin-1")):
            return Refusal(403, "forbidden_origin", "Requests from this Origin are not allowed.", [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return Refusal(413, "too_large", f"The body is over {self.max_body_bytes} bytes.", [])
        return None

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


def is_open_path(path: str) -> bool:
    """A browser's routes: the console (its pages check a session of their own), a connect link
    (`/v1/connections/{upstream}/authorize`, its ticket is the credential) and the authorization server's
    redirect back (rest/connections.py); and the Client ID Metadata Documents authorization servers fetch
    (`/v1/connections/clients/{upstream}.json`, public by design)."""
    if path in (CALLBACK_PATH, CONSOLE_PREFIX) or path.startswith(CONSOLE_PREFIX + "/"):
        return True
    parts = path.split("/")
    if len(parts) != 5 or parts[1:3] != ["v1", "connections"]:
        return False
    link = parts[4] == "authorize" and bool(parts[3])
    return link or (parts[3] == "clients" and parts[4].endswith(".json") and len(parts[4]) > len(".json"))


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def origins(setting: str) -> list[str]:
    return [o.strip().rstrip("/") for o in setting.split(",") if o.strip()]
