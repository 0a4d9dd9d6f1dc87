"""`toolworker gateway`: the HTTP gateway, one ASGI application on uvicorn.

    /mcp            MCP over Streamable HTTP (the `mcp` SDK, stateless: any process answers any request)
    /toolserver/*   XAgent ToolServer-compatible routes (toolserver.py)
    /v1/*           the native REST API (rest/routes.py), described at /v1/openapi.json (rest/document.py)
    /v1/connections users' connections to upstreams that act for them, and their consent pages
                    (rest/connections.py)
    /healthz        ready when a worker answers; /metrics
    /console        the operators' console (console/): HTML pages behind a session of its own
    /.well-known/oauth-protected-resource[/mcp]   where to get an access token (with `oauth:` access)

The process keeps no state of its own between requests: calls wait on the queue and their envelopes in
Redis, so any number of gateway processes can run behind a load balancer, and one can die and restart.
Every request passes the Guard (identity/security.py) first; it names the request's principal
(identity/principals.py).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterable
from typing import Any

import structlog
from mcp.server.lowlevel.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import LOG_LEVEL_META_KEY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from worker import tracing
from worker.gateway import version
from worker.gateway.calls import Calls, open_calls
from worker.gateway.console import open_console
from worker.gateway.console.sources import Extensions, ParkedCalls, UserConnections
from worker.gateway.identity.oauth import JwtVerifier, protected_resource_routes, resource_metadata_url
from worker.gateway.identity.principals import AccessFileError, audience, read_access, static_tokens
from worker.gateway.identity.security import BODY_SCOPE_KEY, Gatekeeper, Guard, is_loopback, origins
from worker.gateway.mcp import code_mode
from worker.gateway.mcp.back_channel import BACK_CHANNEL_SCOPE_KEY, BackChannelTransport, Replies
from worker.gateway.mcp.plain import PlainCalls
from worker.gateway.mcp.server import McpFront, Options
from worker.gateway.mcp.sessions import Handshakes, McpSessions, handshake_of
from worker.gateway.rest import document as openapi_document
from worker.gateway.rest.connections import Connections
from worker.gateway.rest.operations import error
from worker.gateway.rest.routes import Rest
from worker.gateway.rest.upstreams import Upstreams
from worker.gateway.toolserver import ToolServer
from worker.heap import settle_heap
from worker.settings import Settings
from worker.upstreams.first_user import FirstListing
from worker.upstreams.operate import Operator

log = structlog.get_logger("toolworker.gateway")
# How long an idle client connection stays open. Longer than clients keep theirs (httpx, which the mcp SDK's
# client uses, and aiohttp: 5 s and 15 s), so that a client never sends on a connection the gateway is
# closing; with uvicorn's 5 s, a pooled connection left idle that long failed its next request (ReadError,
# which ends an SDK client's whole session). 75 s, as nginx keeps them.
KEEP_ALIVE_S = 75


class _Late:
    """The MCP transports, built when the app starts (with the Redis clients and the catalog)."""

    mcp: BackChannelTransport
    streaming: BackChannelTransport
    sessions: McpSessions
    plain: PlainCalls | None = None


class _McpEndpoint:
    """`/mcp`: the SDK's transport as an ASGI app, reached from the Guard without Starlette's routing.

    Two of them: answers as plain JSON (no stream to set up: a quarter less CPU a call), and, for a
    request that asks for progress or waits for a task's end (`tasks/result`, whose stream carries
    `notifications/tasks/status`) or whose client may be asked during it (back_channel.py), as an event
    stream that can carry it. Of the first kind, a 2026-07-28 client's plain `tools/call` is answered by the
    same handler without the SDK's per-request runner (plain.py)."""

    def __init__(self, late: _Late) -> None:
        self._late = late

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._late.sessions(scope, receive, send, self._transport)

    async def _transport(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = scope.get(BODY_SCOPE_KEY, b"")
        streamed = (
            b'"progressToken"' in body
            or b'"tasks/result"' in body
            or BACK_CHANNEL_SCOPE_KEY in scope
            or _hears_logs(scope, body)
        )
        if streamed:
            return await self._late.streaming.handle_request(scope, receive, send)
        plain = self._late.plain
        if plain is None or not await plain(scope, receive, send):
            await self._late.mcp.handle_request(scope, receive, send)


def _hears_logs(scope: Scope, body: bytes) -> bool:
    """A request whose client set a log level (its session's, or its own `_meta`'s): its stream carries them."""
    handshake = handshake_of(scope)
    return (handshake is not None and handshake.log_level is not None) or LOG_LEVEL_META_KEY.encode() in body


def identity(settings: Settings) -> tuple[Gatekeeper, list[Route]]:
    """Who may call (the tokens and the OAuth issuer the settings and access file name), and the routes of
    the Protected Resource Metadata; raises AccessFileError."""
    access = read_access(settings)
    tokens = static_tokens(settings, access)
    if access is None or access.oauth is None:
        return Gatekeeper(tokens), []
    resource = audience(settings, access.oauth)
    verifier = JwtVerifier(access.oauth, resource)
    routes = protected_resource_routes(resource, access.oauth)
    return Gatekeeper(tokens, verifier, resource_metadata_url(resource)), routes


def create_app(
    settings: Settings, options: Options, gatekeeper: tuple[Gatekeeper, list[Route]] | None = None
) -> ASGIApp:
    late = _Late()
    settings = code_mode.settings_for(settings, options.mode)
    keeper, metadata_routes = gatekeeper or identity(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            open_calls(settings, options.tags) as calls,
            open_console(settings, calls, keeper.tokens, not keeper.required, _console_pages(calls)) as console,
        ):
            front = McpFront.of(calls, settings, options.mode)
            server = front.server()
            late.mcp = _transport(server, settings, json_response=True)
            late.streaming = _transport(server, settings, json_response=False)
            if not tracing.enabled():  # the SDK's span of each request covers the plain calls too when tracing
                late.plain = PlainCalls(server, front.call_tool, late.mcp)
            replies = Replies(calls.redis, settings.gateway_call_timeout_seconds)
            late.sessions = McpSessions(Handshakes(calls.redis), replies)
            for route in [*_routes(calls, settings), *console.routes()]:
                app.router.routes.append(route)
            await calls.health.status()  # the first ping (and its imports) before the first request
            settle_heap()  # as the worker does: the start-up heap out of the collector's way
            async with late.mcp.run(), late.streaming.run():
                yield

    async def serve_openapi_document(request: Request) -> Response:
        return JSONResponse(openapi_document.document(str(request.base_url).rstrip("/"), version()))

    app = Starlette(
        routes=[
            Route("/v1/openapi.json", serve_openapi_document, methods=["GET"]),
            *metadata_routes,
        ],
        lifespan=lifespan,
        exception_handlers={404: _not_found, 405: _not_allowed},
    )
    allowed = origins(settings.gateway_allowed_origins)
    guard = Guard(app, keeper, allowed, settings.gateway_max_body_bytes, mcp=_McpEndpoint(late))
    return guard


def _transport(server: Server[Any], settings: Settings, json_response: bool) -> BackChannelTransport:
    return BackChannelTransport(
        server,
        stateless=True,  # any process answers any request
        json_response=json_response,
        # The Guard checks Origin (and tokens); a Host check would refuse a load balancer's names.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=settings.gateway_max_body_bytes,
    )


def _routes(calls: Calls, settings: Settings) -> Iterable[Route]:
    timeout_s = settings.gateway_call_timeout_seconds
    yield from Rest(calls, timeout_s).routes()
    yield from Upstreams(calls, settings).routes()
    if calls.delegation is not None:
        first = FirstListing(calls.delegation.vault.redis, Operator(settings).refresh_since)
        yield from Connections(calls, calls.delegation, first).routes()
    yield from ToolServer(calls, timeout_s, version()).routes()


async def _not_found(request: Request, exc: Any) -> Response:
    return error(404, "not_found", "No such route.")


async def _not_allowed(request: Request, exc: Any) -> Response:
    """405 with the methods the path takes (RFC 9110 §15.5.6), from every route of that path."""
    allowed = sorted(
        {method for route in request.app.router.routes if _path_of(route, request.scope) for method in route.methods}
    )
    answer = error(405, "method_not_allowed", "This route does not take that method.")
    answer.headers["Allow"] = ", ".join(allowed)
    return answer


def _path_of(route: Any, scope: Any) -> bool:
    """Whether a route serves this request's path (whatever the method)."""
    if not isinstance(route, Route) or not route.methods:
        return False
    match, _ = route.matches({**scope, "method": next(iter(route.methods))})
    return match == Match.FULL


def bind_host(settings: Settings, host: str | None, authenticated: bool | None = None) -> str:
    """The address to listen on: without tokens, loopback only, whatever was asked."""
    wanted = host or settings.gateway_host
    if authenticated is None:
        authenticated = bool(settings.gateway_token_list)
    if authenticated or is_loopback(wanted):
        return wanted
    log.warning(
        "gateway.loopback_only",
        asked=wanted,
        reason="TOOLWORKER_GATEWAY_TOKENS is empty and no access file names a token: it serves 127.0.0.1 only",
    )
    return "127.0.0.1"


def serve(settings: Settings, options: Options, host: str | None = None, port: int | None = None) -> int:
    import uvicorn

    try:
        gatekeeper = identity(settings)
    except AccessFileError as exc:
        print(f"toolworker gateway: {exc}", file=sys.stderr)
        return 78
    keeper = gatekeeper[0]
    address = bind_host(settings, host, keeper.required)
    chosen_port = settings.gateway_port if port is None else port
    auth = ("OAuth access tokens and " if keeper.verifier else "") + "bearer tokens"
    auth = auth if keeper.required else "no tokens (loopback only)"
    print(
        f"toolworker gateway on http://{address}:{chosen_port} (MCP at /mcp, ToolServer at /toolserver, "
        f"REST at /v1; {auth}; mode {options.mode}"
        + (f"; tags {', '.join(options.tags)}" if options.tags else "")
        + ")",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        create_app(settings, options, gatekeeper),
        host=address,
        port=chosen_port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # nothing here reads the client's address
        server_header=False,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    uvicorn.Server(config).run()
    return 0


def _console_pages(calls: Calls) -> Extensions:
    """The console's pages of features with state of their own: approvals, and users' connections when the
    gateway has a vault."""
    vault = calls.delegation if calls.delegation is not None and calls.delegation.enabled else None
    return Extensions(ParkedCalls(calls.decisions), None if vault is None else UserConnections(vault))
