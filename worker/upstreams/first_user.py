"""An MCP upstream whose server wants a user's token even to list its tools (`auth: oauth2_user`) is listed with
the token of the first user who connects it, and is refreshed then.

    callback stores a user's token set ─▶ connected(user, upstream)            (the page answers at once)
        ─▶ SET NX toolworker:mcp:lister:<upstream> user      (the first user to connect it lists it)
        ─▶ not listed yet, or its last refresh failed: a refresh begun now (Refresher.refresh_since, under
           the upstream's lock, as `toolworker upstreams refresh` does); its failure is logged

The refresh itself reads the lister's token through the vault as a call of theirs does (worker/upstreams/
refresh.py), renewing it when due. Removing the lister's connection (revoked, or a refresh the authorization
server refused) forgets them (Vault.delete): the next user who connects lists it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
import structlog

from worker.call.vault import remember_lister
from worker.definitions import listings
from worker.definitions.model import Upstream

log = structlog.get_logger("toolworker.upstreams")


def lists_as_user(upstream: Upstream) -> bool:
    """Whether the upstream's listing acts for a user who connected it."""
    return upstream.mcp is not None and upstream.auth is not None and upstream.auth.type == "oauth2_user"


class FirstListing:
    """What the connect callback starts when a user's token for an MCP upstream is stored; each start runs on
    the loop beside the answer (kept here until it ends)."""

    def __init__(self, redis: aioredis.Redis, refresh: Callable[[Upstream, float], Awaitable[None]]) -> None:
        self.redis = redis
        self.refresh = refresh
        self.running: set[asyncio.Task[None]] = set()

    def connected(self, user: str, upstream: Upstream) -> asyncio.Task[None] | None:
        """`user` connected `upstream` (just stored): its listing started in the background, when it has one."""
        if not lists_as_user(upstream):
            return None
        task = asyncio.create_task(self._listed(user, upstream, time.time()))
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    async def _listed(self, user: str, upstream: Upstream, noticed: float) -> None:
        try:
            first = await remember_lister(self.redis, upstream.name, user)
            log.info("mcp.user_connected", upstream=upstream.name, principal=user, lists=first)
            listing = await listings.read_one(self.redis, upstream.name)
            if listing is not None and listing.error is None and listing.listed_at is not None:
                return
            await self.refresh(upstream, noticed)
        except Exception as exc:  # nobody awaits this: the log is where its failure shows
            log.warning("mcp.first_listing_failed", upstream=upstream.name, error=str(exc) or type(exc).__name__)
