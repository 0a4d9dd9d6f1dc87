"""A protected upstream for the vault's tests: it accepts only access tokens (JWT) an authorization server
issued for it (signature from the issuer's JWKS, `iss`, `aud`, `exp`), answers `/me` with the token's
`sub`, and remembers every token it was shown (to count refreshes) and every one it refused with a 401 (an
upstream that counts failed authentications). Tokens put in `refused` get a 401."""

from __future__ import annotations

from dataclasses import dataclass, field

import jwt
from aiohttp import web


@dataclass
class Guarded:
    issuer: str
    audience: str = ""
    seen: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    # Each token answered 401 (expired, or put in `refused`), in order.
    refusals: list[str] = field(default_factory=list)
    _keys: jwt.PyJWKClient | None = None

    def subject(self, token: str) -> str | None:
        if self._keys is None:
            self._keys = jwt.PyJWKClient(self.issuer + "/jwks", cache_jwk_set=True, lifespan=600)
        try:
            key = self._keys.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key, algorithms=["RS256"], audience=self.audience, issuer=self.issuer)
        except jwt.PyJWTError:
            return None
        sub = claims.get("sub")
        return sub if isinstance(sub, str) else None


def protected_upstream(guarded: Guarded) -> web.Application:
    async def me(request: web.Request) -> web.Response:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or not token:
            return web.json_response({"error": "no token"}, status=401)
        guarded.seen.append(token)
        sub = None if token in guarded.refused else guarded.subject(token)
        if sub is None:
            guarded.refusals.append(token)
            return web.json_response({"error": "invalid_token"}, status=401)
        return web.json_response({"sub": sub})

    app = web.Application()
    app.router.add_get("/me", me)
    return app
