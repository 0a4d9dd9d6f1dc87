"""A protected MCP server made with the `mcp` SDK's `MCPServer` and its resource-server settings (`AuthSettings`,
a `TokenVerifier`): it answers a request without a token 401 with `WWW-Authenticate: resource_metadata`,
serves its RFC 9728 metadata naming ISSUER as its authorization server, and verifies the JWT access tokens
ISSUER signs (its JWKS) for this server's URL as audience, requiring SCOPE.

    python -m tests.support.mcp_protected_server PORT ISSUER SCOPE

Its `whoami` tool answers the token's subject, client and scopes as it verified them; every request's
token (or none) is appended as one JSON line to the file named by MCP_PROTECTED_SEEN, if set.
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


def build(port: int, issuer: str, scope: str) -> MCPServer:
    resource = f"http://127.0.0.1:{port}/mcp"
    settings = AuthSettings(
        issuer_url=AnyHttpUrl(issuer), resource_server_url=AnyHttpUrl(resource), required_scopes=[scope]
    )
    server = MCPServer("protected-upstream", auth=settings, token_verifier=JwtVerifier(issuer, resource))

    @server.tool(description="Who the access token names, as this server verified it.")
    def whoami() -> dict[str, object]:
        token = get_access_token()
        assert token is not None
        return {"subject": token.subject, "client": token.client_id, "scopes": token.scopes}

    return server


def main() -> None:
    port, issuer, scope = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    uvicorn.run(build(port, issuer, scope).streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
