"""What operators do with upstreams, for the command line and the REST API: list them (kind, protocol
negotiated, tools, last refresh, last error), refresh an MCP upstream now, accept what `pin` withheld."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from worker.call.delegated import UserTokens
from worker.call.mcp_authorization import McpAuthorization
from worker.call.vault import Keyring
from worker.connections import connect
from worker.definitions.mcp_tools import Listing
from worker.definitions.model import ToolSet, Upstream
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport
from worker.mcp_client.sessions import Sessions
from worker.settings import Settings
from worker.upstreams.refresh import Refresher


def rows(toolset: ToolSet, found: Mapping[str, Listing]) -> list[dict[str, Any]]:
    """One row per upstream: an HTTP API's kind and tools, an MCP server's listing as last stored."""
    out = []
    for name, upstream in sorted(toolset.upstreams.items()):
        tools = sum(1 for tool in toolset.tools.values() if tool.upstream == name)
        row: dict[str, Any] = {"name": name, "kind": "http" if upstream.mcp is None else "mcp", "tools": tools}
        if upstream.mcp is not None:
            listing = found.get(name)
            row.update(Listing(name).summary() if listing is None else listing.summary(), tools=tools)
            if listing is None:
                row["error"] = "not listed yet"
        out.append(row)
    return out


class Operator:
    """A refresher of its own (a short-lived MCP session per refresh), for one command or request."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def refresh(self, toolset: ToolSet, name: str) -> Listing:
        """Refresh one MCP upstream now; KeyError when there is no MCP upstream of that name."""
        upstream = toolset.upstreams.get(name)
        if upstream is None or upstream.mcp is None:
            raise KeyError(f"there is no MCP upstream named {name!r}")
        listing: Listing = await self._run(lambda refresher: refresher.refresh(upstream))
        return listing

    async def refresh_since(self, upstream: Upstream, noticed: float) -> None:
        """Make sure a refresh begun at `noticed` or later has read the server (this one, or another process's
        under the upstream's lock)."""
        await self._run(lambda refresher: refresher.refresh_since(upstream, noticed))

    async def accept(self, name: str, tool: str | None) -> Listing:
        listing: Listing = await self._run(lambda refresher: refresher.accept(name, tool))
        return listing

    async def _run(self, work: Any) -> Any:
        client = connect(self.settings.redis_url)
        sessions = Sessions()
        transport = HttpTransport(EgressPolicy.parse(self.settings.egress_allow), self.settings.dns_server_list)
        try:
            policy = EgressPolicy.parse(self.settings.egress_allow)
            keyring = Keyring.parse(self.settings.vault_keys.get_secret_value())
            public_url = self.settings.public_url if keyring else None  # as the workers name the fleet's client
            discovery = McpAuthorization(client, policy, transport, keyring, public_url)
            environ = dict(os.environ)
            maxlen = self.settings.audit_stream_maxlen
            users = UserTokens(client, keyring, None, maxlen)
            return await work(Refresher(client, sessions, environ, transport, maxlen, discovery, users))
        finally:
            await sessions.close()
            await transport.close()
            await client.aclose()
