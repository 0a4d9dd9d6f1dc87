"""A protected MCP server made with the `mcp` SDK's `MCPServer` and its resource-server settings (`AuthSettings`,
a `TokenVerifier`): it answers a request without a token 401 with `WWW-Authenticate: resource_metadata`,
serves its RFC 9728 metadata naming ISSUER as its authorization server, and verifies the JWT access tokens
ISSUER signs (its JWKS) for this server's URL as audience, requiring SCOPE.

    python -m tests.support.mcp_protected_server PORT ISSUER SCOPE [TOOL=SCOPE ...]

Its `whoami` tool answers the token's subject, client and scopes as it verified them; every request's
token (or none) is appended as one JSON line to the file named by MCP_PROTECTED_SEEN, if set. Each TOOL=SCOPE
adds a tool like `whoami` that needs one more scope: the SDK checks one set of scopes for the whole endpoint, so
a check in front of its app answers a `tools/call` of that tool, when the verified token lacks the scope, as
RFC 6750 §3.1 and the MCP specification's step-up say: 403 `WWW-Authenticate: Bearer error="insufficient_scope",
scope="SCOPE TOOL'S-SCOPE"`.
"""

from __future__ import annotations

import json
import os
import sys

import jwt
import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from pydantic import AnyHttpUrl
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class JwtVerifier:
    """The provider's JWT access tokens, checked against its published keys, issuer and this server as audience."""

    def __init__(self, issuer: str, resource: str) -> None:
        self.issuer, self.resource = issuer, resource
        self.keys = jwt.PyJWKClient(issuer + "/jwks")

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            key = self.keys.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, ["RS256"], audience=self.resource, issuer=self.issuer)
        except jwt.PyJWTError:
            _seen({"token": "refused"})
            return None
        scopes = str(claims.get("scope") or "").split()
        _seen({"sub": claims.get("sub"), "client_id": claims.get("client_id"), "scopes": scopes, "aud": claims["aud"]})
        client_id = str(claims.get("client_id") or claims.get("azp") or "")
        return AccessToken(
            token=token, client_id=client_id, scopes=scopes, expires_at=claims.get("exp"), subject=claims.get("sub")
        )


def _seen(record: dict[str, object]) -> None:
    path = os.environ.get("MCP_PROTECTED_SEEN")
    if path:
        with open(path, "a") as seen:
            seen.write(json.dumps(record) + "\n")


def build(port: int, issuer: str, scope: str, tool_scopes: dict[str, str] | None = None) -> MCPServer:
    resource = f"http://127.0.0.1:{port}/mcp"
    settings = AuthSettings(
        issuer_url=AnyHttpUrl(issuer), resource_server_url=AnyHttpUrl(resource), required_scopes=[scope]
    )
    server = MCPServer("protected-upstream", auth=settings, token_verifier=JwtVerifier(issuer, resource))

    def whoami() -> dict[str, object]:
        token = get_access_token()
        assert token is not None
        return {"subject": token.subject, "client": token.client_id, "scopes": token.scopes}

    server.tool(name="whoami", description="Who the access token names, as this server verified it.")(whoami)
    for name, needed in (tool_scopes or {}).items():
        server.tool(name=name, description=f"Like whoami, with the scope {needed} besides.")(whoami)
    return server


class ToolScopes:
    """In front of the SDK's app: a `tools/call` of a tool that needs a scope the verified token lacks is 403
    `insufficient_scope`, naming the scopes that call needs."""

    def __init__(self, app: ASGIApp, verifier: JwtVerifier, scope: str, tool_scopes: dict[str, str]) -> None:
        self.app, self.verifier, self.scope, self.tool_scopes = app, verifier, scope, tool_scopes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        needed = await self._lacking(scope, b"".join(m.get("body", b"") for m in messages))
        if needed is not None:
            return await _insufficient(send, f"{self.scope} {needed}")

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)

    async def _lacking(self, scope: Scope, body: bytes) -> str | None:
        """The scope a tools/call needs and its token lacks; None when it lacks none (or has no valid token)."""
        try:
            request = json.loads(body)
            needed = self.tool_scopes.get(request["params"]["name"]) if request["method"] == "tools/call" else None
        except (ValueError, KeyError, TypeError):
            return None
        authorization = dict(scope["headers"]).get(b"authorization", b"").decode()
        if needed is None or not authorization.lower().startswith("bearer "):
            return None
        token = await self.verifier.verify_token(authorization[7:])
        return needed if token is not None and needed not in token.scopes else None


async def _insufficient(send: Send, scopes: str) -> None:
    body = json.dumps({"error": "insufficient_scope", "error_description": f"Required scopes: {scopes}"}).encode()
    challenge = f'Bearer error="insufficient_scope", scope="{scopes}"'
    headers = [(b"content-type", b"application/json"), (b"www-authenticate", challenge.encode())]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    port, issuer, scope = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    tool_scopes = dict(item.split("=", 1) for item in sys.argv[4:])
    app: ASGIApp = build(port, issuer, scope, tool_scopes).streamable_http_app()
    if tool_scopes:
        app = ToolScopes(app, JwtVerifier(issuer, f"http://127.0.0.1:{port}/mcp"), scope, tool_scopes)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
