"""Who may see a console page, and which POSTs the console accepts.

- A page needs a session (sessions.py) whose principal may `operate`: without one, a redirect to the
  login page; with one that may not, 403.
- A POST (every change) needs, besides, the session's CSRF token in the form, and an Origin that is the
  gateway's own (TOOLWORKER_GATEWAY_PUBLIC_URL's, else the request's own scheme and Host): else 403, and
  nothing changes. The login form, before any session, carries a token of its own (double submit).
- The session cookie is HttpOnly, SameSite=Strict, and Secure unless the gateway serves plain http on a
  loopback address.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request

from worker.gateway.console.sessions import COOKIE, CSRF_FIELD, LOGIN_COOKIE, Session, Sessions
from worker.gateway.identity.principals import LOCAL, Principal, StaticTokens
from worker.gateway.identity.security import is_loopback

CONSOLE_PATH = "/console"


class Gate:
    def __init__(self, sessions: Sessions, tokens: StaticTokens, tokenless: bool, public_url: str) -> None:
        self.sessions = sessions
        self._tokens = tokens
        # A gateway without any token serves loopback only, to the local principal: so does its console.
        self.tokenless = tokenless
        self._public_origin = _origin_of(public_url) if public_url else None

    def principal(self, token: str) -> Principal | None:
        """The principal a static token names (compared in constant time), or None."""
        if self.tokenless:
            return LOCAL
        return self._tokens.match(token.encode()) if token else None

    async def session(self, request: Request) -> Session | None:
        return await self.sessions.find(request.cookies.get(COOKIE))

    def same_origin(self, request: Request) -> bool:
        """A request without Origin (not a browser's form) passes; a browser's must name the gateway."""
        given = request.headers.get("origin")
        if given is None:
            return True
        expected = self._public_origin or _origin_of(f"{request.url.scheme}://{request.headers.get('host', '')}")
        return given.lower().rstrip("/") == expected

    def login_token_matches(self, request: Request, form: FormData) -> bool:
        cookie, given = request.cookies.get(LOGIN_COOKIE, ""), form.get(CSRF_FIELD)
        return bool(cookie) and isinstance(given, str) and hmac.compare_digest(cookie.encode(), given.encode())

    def secure_cookie(self, request: Request) -> bool:
        if self._public_origin is not None and self._public_origin.startswith("https://"):
            return True
        return not (request.url.scheme == "http" and is_loopback(request.url.hostname or ""))


def csrf_of(form: FormData) -> str:
    given = form.get(CSRF_FIELD)
    return given if isinstance(given, str) else ""


def _origin_of(url: str) -> str:
    parts = urlsplit(url.strip())
    default = {"http": 80, "https": 443}.get(parts.scheme)
    port = f":{parts.port}" if parts.port is not None and parts.port != default else ""
    host = (parts.hostname or "").lower()
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}{port}".lower()
