"""Users' connections to upstreams that act for them: the REST routes and the two pages a browser opens.

    GET    /v1/connections                          the caller's own: upstream, scopes, expiresAt (no token)
    DELETE /v1/connections/{upstream}               revoked at the server (RFC 7009, when it can) and removed
    GET    /v1/connections/{upstream}/authorize     a connect link: 302 to the authorization server
    GET    /v1/connections/callback                 the server's redirect back: code exchanged, set stored
    GET    /v1/connections/clients/{upstream}.json  the Client ID Metadata Document of the fleet's client at an
                                                    MCP upstream's authorization server (public)

    browser ──GET connect link──▶ gateway ──302 (state, PKCE S256, cookie)──▶ authorization server
    browser ◀──────────── 302 callback?code&state&iss ◀── (the user logs in and consents)
    browser ──GET callback (cookie)──▶ gateway ──code + verifier──▶ token endpoint ──▶ vault ──▶ "connected"
                                           └─▶ an `oauth2_user` MCP upstream: its listing, in the background, with
                                               the first connected user's token (worker/upstreams/first_user.py)

The two browser routes and the metadata documents need no bearer token: the link's ticket (single use, for one
user and upstream) is the credential, and the state is bound to the browser that opened the link by a cookie.
A ticket or state that is unknown, spent, expired or another browser's is refused (400) and nothing is stored.
"""

from __future__ import annotations

import html
import json
import secrets
from typing import Annotated

import structlog
from fastapi import Path, Query
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from worker import errors
from worker.call.connect import CALLBACK_PATH
from worker.call.mcp_clients import DOCUMENT_PATH, metadata_document
from worker.connections import async_client
from worker.definitions.model import ToolSet, Upstream
from worker.gateway.calls import Calls
from worker.gateway.identity.delegation import Delegation, open_delegation
from worker.gateway.identity.principals import principal_of
from worker.gateway.rest.bodies import BadBody
from worker.gateway.rest.models import (
    CallbackQuery,
    ClientMetadataDocument,
    ConnectionList,
    Error,
    Removed,
    TicketQuery,
)
from worker.gateway.rest.operations import Answer, Operation, error, served
from worker.gateway.rest.routes import ERRORS
from worker.settings import Settings
from worker.upstreams.first_user import FirstListing

log = structlog.get_logger("toolworker.gateway.connections")
BINDING_COOKIE = "toolworker_connect"


class ConnectionName(Convertor[str]):
    """An upstream's name in `/v1/connections/{upstream}`, but not the callback's own path segment: a DELETE
    there is a method the callback does not take (405), not a revocation of an upstream named `callback`."""

    regex = "(?!callback$)[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("connection", ConnectionName())


class Connections:
    def __init__(self, calls: Calls, delegation: Delegation, first: FirstListing | None = None) -> None:
        self.calls = calls
        self.delegation = delegation
        self.first = first

    def routes(self) -> list[Route]:
        return served(OPERATIONS, self)

    def _upstream(self, name: str) -> Upstream | None:
        upstream = self.calls.catalog.snapshot.toolset.upstreams.get(name)
        return upstream if upstream is not None and upstream.auth is not None and upstream.auth.delegated else None

    async def list_connections(self, request: Request) -> Response:
        user = principal_of(request.scope).name
        found = await self.delegation.connections(user)
        return JSONResponse({"connections": [c.to_dict() for c in found]})

    async def revoke(self, request: Request, upstream: UpstreamName) -> Response:
        user = principal_of(request.scope).name
        enabled = self.delegation.enabled
        revoked = await self.delegation.revoke(user, self._upstream(upstream), upstream) if enabled else None
        if revoked is None:
            return error(404, "unknown_connection", f"There is no connection to {upstream!r} for {user!r}.")
        return JSONResponse({"upstream": upstream, "removed": True, "revokedAtServer": revoked})

    async def authorize(
        self, request: Request, upstream: UpstreamName, query: Annotated[TicketQuery, Query()]
    ) -> Response:
        defined = self._upstream(upstream)
        if defined is None or not self.delegation.enabled:
            return _page(404, "This connect link is not valid.", "Ask for the tool to be called again for a new link.")
        redeemed = await self.delegation.links.redeem(query.ticket, upstream)
        if redeemed is None:  # unknown, spent or expired: refused
            return _page(403, "This connect link is not valid any more.", "It was used already or it expired.")
        user, expires_at, scopes = redeemed
        binding = secrets.token_urlsafe(32)
        try:
            location = await self.delegation.start(user, defined, binding, expires_at, scopes)
        except errors.ToolError as exc:
            return _page(502, "The authorization server cannot be reached.", exc.message)
        response = RedirectResponse(location, status_code=302)
        response.set_cookie(
            BINDING_COOKIE,
            binding,
            max_age=self.delegation.links.ttl_s,
            path=CALLBACK_PATH,
            httponly=True,
            samesite="lax",  # sent on the server's top-level redirect back
            secure=self.delegation.links.public_url.startswith("https://"),
        )
        return response

    async def client_document(self, request: Request, upstream: UpstreamName) -> Response:
        """The Client ID Metadata Document of an MCP upstream acting for users without a pre-registered client."""
        defined = self._upstream(upstream)
        auth = None if defined is None else defined.auth
        if defined is None or defined.mcp is None or auth is None or auth.type != "oauth2_user" or auth.client_id:
            return error(404, "unknown_client", f"No MCP upstream {upstream!r} names its client by this document.")
        document = metadata_document(self.delegation.links.public_url, upstream)
        return JSONResponse(document, headers={"Cache-Control": "public, max-age=300"})

    async def callback(self, request: Request, query: Annotated[CallbackQuery, Query()]) -> Response:
        pending = await self.delegation.links.finish(query.state) if self.delegation.enabled else None
        if pending is None or not pending.bound_to(request.cookies.get(BINDING_COOKIE)):
            return _page(403, "This authorization is not valid.", "It is unknown, used, expired, or another browser's.")
        upstream = self._upstream(pending.upstream)
        if upstream is None or query.code is None:
            reason = query.error or "no code"
            return _page(403, "Access was not granted.", f"The authorization server said: {reason}.")
        try:
            tokens = await self.delegation.finish(pending, upstream, query.code, query.iss)
        except errors.ToolError as exc:
            log.warning("gateway.connect_failed", upstream=upstream.name, user=pending.user, reason=exc.message)
            return _page(400, "The connection could not be made.", exc.message)
        if self.first is not None:
            self.first.connected(pending.user, upstream)
        scopes = ", ".join(tokens.scopes) or "its default access"
        response = _page(200, f"Connected {upstream.name}.", f"Calls for {pending.user} may now use it ({scopes}).")
        response.delete_cookie(BINDING_COOKIE, path=CALLBACK_PATH)
        return response


async def run_command(
    settings: Settings, action: str, user: str, upstream: str | None, toolset: ToolSet | None
) -> tuple[int, list[str]]:
    """`toolworker connections list|revoke`: the exit code and the lines to print."""
    redis = async_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
    delegation = open_delegation(settings, redis)
    try:
        if not delegation.enabled:
            return 78, ["toolworker connections: TOOLWORKER_VAULT_KEYS is not set"]
        if action == "list":
            return 0, [json.dumps(c.to_dict()) for c in await delegation.connections(user)]
        assert upstream is not None
        defined = toolset.upstreams.get(upstream) if toolset is not None else None
        revoked = await delegation.revoke(user, defined, upstream)
        if revoked is None:
            return 1, [f"toolworker connections: {user!r} has no connection to {upstream!r}"]
        return 0, [json.dumps({"upstream": upstream, "removed": True, "revokedAtServer": revoked})]
    finally:
        await delegation.close()
        await redis.aclose()


def _page(status: int, title: str, text: str) -> HTMLResponse:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'><title>toolworker</title></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(text)}</p><p>You can close this window.</p></body></html>"
    )
    return HTMLResponse(
        body, status_code=status, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
    )


def _bad_link(problem: BadBody) -> Response:
    """A connect link without its ticket: the page says to ask for a new one."""
    return _page(400, "This connect link is not valid.", "Ask for the tool to be called again for a new link.")


def _bad_authorization(problem: BadBody) -> Response:
    """A redirect back without its state (or with an empty value)."""
    missing = ", ".join(p["field"] for p in problem.problems)
    return _page(400, "This authorization is not valid.", f"It names no {missing}.")


UpstreamName = Annotated[str, Path(min_length=1)]
_LINK_REFUSED = Answer("The link or the authorization is not valid (unknown, used, expired).", str, "text/html")
_MALFORMED = Answer("The link or the redirect names no ticket or state.", str, "text/html")
OPERATIONS = [
    Operation(
        "GET",
        "/v1/connections",
        Connections.list_connections,
        "listConnections",
        "The caller's connections to upstreams that act for it: upstream, scopes, expiry",
        {200: Answer("The caller's own connections.", ConnectionList), **ERRORS},
    ),
    Operation(
        "GET",
        CALLBACK_PATH,
        Connections.callback,
        "connectCallback",
        "The authorization server's redirect back: the code is exchanged and the connection stored",
        {200: Answer("A short page for the user.", str, "text/html"), 400: _MALFORMED, 403: _LINK_REFUSED},
        open=True,
        refuse=_bad_authorization,
    ),
    Operation(
        "GET",
        DOCUMENT_PATH,
        Connections.client_document,
        "getClientMetadataDocument",
        "The Client ID Metadata Document naming the fleet's client at an MCP upstream's authorization server",
        {
            200: Answer("The document; its client_id is its own URL.", ClientMetadataDocument),
            404: Answer("No MCP upstream of this name names its client by a metadata document.", Error),
        },
        open=True,
    ),
    Operation(
        "DELETE",
        "/v1/connections/{upstream:connection}",
        Connections.revoke,
        "revokeConnection",
        "Revoke the caller's grant at the authorization server (RFC 7009) and remove the connection",
        {
            200: Answer("Removed; revokedAtServer says whether the server took the revocation.", Removed),
            404: Answer("The caller has no connection to this upstream.", Error),
            **ERRORS,
        },
    ),
    Operation(
        "GET",
        "/v1/connections/{upstream}/authorize",
        Connections.authorize,
        "openConnectLink",
        "A connect link (single use, for one user): redirects the browser to the authorization server",
        {
            302: Answer("To the authorization server (state and PKCE S256).", None, ""),
            400: _MALFORMED,
            403: _LINK_REFUSED,
            404: Answer("No upstream of this name acts for its users here.", str, "text/html"),
            502: Answer("The authorization server cannot be reached.", str, "text/html"),
        },
        open=True,
        refuse=_bad_link,
    ),
]
