"""Refreshing an MCP upstream's listing, now (`toolworker upstreams refresh`, REST) or when it is due (the
workers, one process at a time per upstream through a Redis lock), and accepting what `pin` withheld.

    refresh ─▶ credential (authorize, as for a call) ─▶ sessions.list_tools (every page)
            ─▶ mcp_tools.merged (digests, changes, pin) ─▶ listings.write (+ audit records)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from worker import errors
from worker.call.auth import TokenCache
from worker.call.delegated import UserTokens
from worker.call.mcp_server import server_spec
from worker.call.vault import lister
from worker.constants import MCP_REFRESH_LOCK_PREFIX
from worker.definitions import listings
from worker.definitions.mcp_tools import Listing, accepted, kept, merged
from worker.definitions.model import ToolSet, Upstream
from worker.http.transport import HttpTransport
from worker.protocol import ToolCall

if TYPE_CHECKING:  # the MCP client: loaded by whoever makes the sessions
    from worker.call.mcp_authorization import McpAuthorization
    from worker.mcp_client.sessions import Sessions

log = structlog.get_logger("toolworker.upstreams")
# How often the workers look for an upstream whose refresh is due.
DUE_CHECK_S = 5.0
# How often a refresh asked for looks again at a lock another process holds.
LOCK_WAIT_S = 0.5


@dataclass
class Refresher:
    """What a refresh needs: Redis (listings, tokens), the MCP sessions, the environment, the audit's cap; and
    the vault (without connect links: a listing's error is no place for one), for an `oauth2_user` upstream,
    which is listed with the token of the user who connected it first (worker/upstreams/first_user.py)."""

    redis: aioredis.Redis
    sessions: Sessions
    environ: Mapping[str, str]
    transport: HttpTransport
    audit_maxlen: int
    authorization: McpAuthorization | None = None
    users: UserTokens | None = None

    async def refresh(self, upstream: Upstream) -> Listing:
        """Read the server's tools now and store the listing; a server that fails keeps its last tools."""
        assert upstream.mcp is not None
        previous = await listings.read_one(self.redis, upstream.name)
        now = time.time()
        try:
            protocol, tools = await self._listed(upstream)
        except errors.ToolError as exc:
            listing = replace(previous or Listing(upstream.name), tried_at=now, error=exc.message)
            await listings.write(self.redis, listing, [], self.audit_maxlen)
            log.warning("mcp.refresh_failed", upstream=upstream.name, error=exc.message)
            return listing
        found = {str(tool["name"]): kept(tool) for tool in tools}
        served, pending, changes = merged(previous, upstream.name, found, upstream.mcp.pin)
        listing = Listing(upstream.name, served, pending, protocol, now, now, None)
        await listings.write(self.redis, listing, [c.record() for c in changes], self.audit_maxlen)
        log.info("mcp.refreshed", upstream=upstream.name, tools=len(served), pending=len(pending))
        return listing

    async def _listed(self, upstream: Upstream) -> tuple[str, list[dict[str, object]]]:
        deadline = time.time() + upstream.connect_timeout_s + upstream.timeout_s
        call = ToolCall(call_id=f"refresh:{upstream.name}", tool="tools/list", user=await self._lister(upstream))
        tokens = TokenCache(self.redis)
        spec, _ = await server_spec(
            upstream, call, self.environ, tokens, deadline, self.transport, self.users, self.authorization
        )
        return await self.sessions.list_tools(spec)

    async def _lister(self, upstream: Upstream) -> str | None:
        """The user a listing acts for: the first who connected an `oauth2_user` upstream (none for others)."""
        if upstream.auth is None or upstream.auth.type != "oauth2_user":
            return None
        user = await lister(self.redis, upstream.name)
        if user is None:
            raise errors.AuthorizationRequired(
                "It wants a user's token even to list its tools, and no user has connected it yet: it is listed "
                "with the token of the first user who does (a call of one of its tools gives them a connect link)."
            )
        return user

    async def accept(self, upstream: str, tool: str | None) -> Listing:
        """Serve what `pin` withheld (every tool, or the one named by the server's name); KeyError: nothing."""
        listing = await listings.read_one(self.redis, upstream)
        if listing is None:
            raise KeyError(f"the upstream {upstream!r} has not been listed")
        done = accepted(listing, tool)
        names = sorted(set(listing.pending) - set(done.pending))
        records = [{"kind": "mcp_tool_accepted", "upstream": upstream, "tool": name} for name in names]
        await listings.write(self.redis, done, records, self.audit_maxlen)
        return done

    async def refresh_due(self, toolset: ToolSet) -> None:
        """Refresh every MCP upstream whose `refresh_seconds` have passed, each by one process at a time."""
        found = await listings.read_async(self.redis)
        now = time.time()
        for upstream in toolset.upstreams.values():
            if upstream.mcp is None:
                continue
            listing = found.get(upstream.name)
            if listing is not None and listing.tried_at is not None and now - listing.tried_at < upstream.mcp.refresh_s:
                continue
            await self.refresh_locked(upstream)

    async def refresh_locked(self, upstream: Upstream) -> bool:
        """Refresh under the upstream's Redis lock; False (nothing done) while another process holds it."""
        lock = MCP_REFRESH_LOCK_PREFIX + upstream.name
        expiry = max(1, int(upstream.connect_timeout_s + upstream.timeout_s))
        if not await self.redis.set(lock, "1", nx=True, ex=expiry):
            return False
        try:
            await self.refresh(upstream)
        finally:
            await self.redis.delete(lock)
        return True

    async def refresh_since(self, upstream: Upstream, noticed: float) -> None:
        """Make sure a refresh that began at `noticed` or later has read the server: this process's own, or
        another's (the lock held, its listing tried since); waits at most a refresh's time for the lock."""
        deadline = time.time() + 2 * (upstream.connect_timeout_s + upstream.timeout_s)
        while True:
            listing = await listings.read_one(self.redis, upstream.name)
            if listing is not None and listing.tried_at is not None and listing.tried_at >= noticed:
                return
            if await self.refresh_locked(upstream) or time.time() > deadline:
                return
            await asyncio.sleep(LOCK_WAIT_S)


async def refresh_forever(refresher: Callable[[], Refresher], toolset: Callable[[], ToolSet]) -> None:
    """Refresh what is due, every DUE_CHECK_S, for as long as the task runs (through Redis outages)."""
    while True:
        try:
            if listings.has_mcp(toolset()):  # no MCP upstream: nothing to read, Redis is not asked
                await refresher().refresh_due(toolset())
        except RedisError as exc:
            log.warning("mcp.refresh_check_failed", error=str(exc))
        await asyncio.sleep(DUE_CHECK_S)
