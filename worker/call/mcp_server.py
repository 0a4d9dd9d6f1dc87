"""An MCP upstream as its client reaches it (worker/mcp_client/): its URL and headers rendered, and its
credential on them by the same `authorize` as an HTTP upstream's, so every auth type works on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from worker.call.auth import TokenCache, authorize
from worker.call.delegated import UserTokens
from worker.call.rendering import render_secret
from worker.definitions.model import Upstream
from worker.http.transport import HttpTransport, PreparedRequest
from worker.mcp_client.spec import ServerSpec
from worker.protocol import ToolCall

if TYPE_CHECKING:
    from worker.call.mcp_authorization import McpAuthorization


def bare_request(upstream: Upstream, environ: Mapping[str, str]) -> PreparedRequest:
    """The POST every request to the server is, before its credential: URL and the upstream's headers."""
    url = render_secret(upstream.base_url, environ)
    headers = tuple((name, render_secret(value, environ)) for name, value in upstream.headers.items())
    return PreparedRequest("POST", url, headers, None, frozenset(), frozenset())


async def server_spec(
    upstream: Upstream,
    call: ToolCall,
    environ: Mapping[str, str],
    tokens: TokenCache,
    deadline: float,
    transport: HttpTransport,
    users: UserTokens | None,
    authorization: McpAuthorization | None = None,
) -> tuple[ServerSpec, PreparedRequest]:
    """The server as the client reaches it for this call, and the request that describes it (its secrets);
    OAuth endpoints the upstream leaves to discovery are discovered first."""
    if authorization is not None:
        upstream = await authorization.upstream(upstream, environ, deadline)
    request, _ = await authorize(
        bare_request(upstream, environ),
        upstream,
        call,
        environ,
        tokens,
        deadline,
        transport,
        None,
        None if users is None else users.token,
    )
    return spec_of(upstream, request), request


def spec_of(upstream: Upstream, request: PreparedRequest) -> ServerSpec:
    assert upstream.mcp is not None
    return ServerSpec(
        name=upstream.name,
        url=request.url,
        transport=upstream.mcp.transport,
        headers=request.headers,
        connect_timeout_s=upstream.connect_timeout_s,
        timeout_s=upstream.timeout_s,
    )
