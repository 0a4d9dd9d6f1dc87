"""A small OAuth 2.1 authorization server for `make run`'s demo, so that a newcomer sees a consent flow end
to end: authorization code with PKCE S256 (a consent page where you pick a user name), refresh tokens
rotated on every use, revocation (RFC 7009), and a protected `/profile` that says whose token it got.

In memory, for one process, no client authentication (a public client with PKCE): a demo, not a server.
"""

from __future__ import annotations

import base64
import hashlib
import html
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from aiohttp import web

ACCESS_TOKEN_LIFETIME_S = 300
CLIENT_ID = "toolworker-demo"


@dataclass
class Grant:
    user: str
    scopes: list[str]


class AuthServer:
    """The codes and tokens it gave, in memory."""

    def __init__(self) -> None:
        self.codes: dict[str, tuple[Grant, str, str]] = {}  # code: the grant, the PKCE challenge, redirect_uri
        self.access: dict[str, tuple[Grant, float]] = {}  # access token: the grant, when it expires
        self.refresh: dict[str, Grant] = {}

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/oauth/authorize", self.authorize_page)
        app.router.add_post("/oauth/authorize", self.authorize)
        app.router.add_post("/oauth/token", self.token)
        app.router.add_post("/oauth/revoke", self.revoke)
        app.router.add_get("/profile", self.profile)

    async def authorize_page(self, request: web.Request) -> web.Response:
        query = request.query
        if query.get("client_id") != CLIENT_ID or query.get("code_challenge_method") != "S256":
            return web.json_response({"error": "invalid_request"}, status=400)
        hidden = "".join(
            f"<input type='hidden' name='{html.escape(k)}' value='{html.escape(v)}'>" for k, v in query.items()
        )
        scopes = html.escape(query.get("scope", ""))
        return _page(
            f"<h1>Demo sign-in</h1><form method='post'>{hidden}<p>Sign in as <input name='login' value='demo-user'></p>"
            f"<p>toolworker asks to act for you with: <b>{scopes}</b></p><button>Allow</button></form>"
        )

    async def authorize(self, request: web.Request) -> web.Response:
        form = await request.post()
        code = secrets.token_urlsafe(24)
        grant = Grant(str(form.get("login") or "demo-user"), str(form.get("scope", "")).split())
        redirect_uri = str(form["redirect_uri"])
        self.codes[code] = (grant, str(form["code_challenge"]), redirect_uri)
        raise web.HTTPFound(redirect_uri + "?" + urlencode({"code": code, "state": str(form["state"])}))

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") == "authorization_code":
            found = self.codes.pop(str(form.get("code")), None)
            verifier = str(form.get("code_verifier", "")).encode()
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).decode().rstrip("=")
            valid = found is not None and found[1] == challenge and found[2] == form.get("redirect_uri")
            grant = found[0] if found is not None and valid else None
        elif form.get("grant_type") == "refresh_token":
            grant = self.refresh.pop(str(form.get("refresh_token")), None)  # rotated: each is used once
        else:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        if grant is None:
            return web.json_response({"error": "invalid_grant"}, status=400)
        return web.json_response(self._issue(grant))

    async def revoke(self, request: web.Request) -> web.Response:
        form = await request.post()
        self.refresh.pop(str(form.get("token")), None)
        self.access.pop(str(form.get("token")), None)
        return web.Response(status=200)

    async def profile(self, request: web.Request) -> web.Response:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        found = self.access.get(given) if scheme == "Bearer" else None
        if found is None or found[1] < time.time():
            return web.json_response({"error": "invalid_token"}, status=401)
        return web.json_response({"user": found[0].user, "scopes": found[0].scopes, "plan": "demo"})

    def _issue(self, grant: Grant) -> dict[str, object]:
        access_token, refresh_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self.access[access_token] = (grant, time.time() + ACCESS_TOKEN_LIFETIME_S)
        self.refresh[refresh_token] = grant
        return {
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": ACCESS_TOKEN_LIFETIME_S,
            "refresh_token": refresh_token,
            "scope": " ".join(grant.scopes),
        }


def _page(body: str) -> web.Response:
    head = "<!doctype html><html><head><meta charset='utf-8'><title>Demo sign-in</title></head>"
    return web.Response(text=f"{head}<body>{body}</body></html>", content_type="text/html")
