"""MCP upstreams' tool listings kept in Redis beside the shared definitions, so that every worker, gateway and
command serves the same catalog: one hash (upstream -> Listing JSON) and a number that grows on each change,
which readers poll as they poll the definitions' version. A refresh (worker/upstreams/) writes them; this
module owns the keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import redis
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from worker.constants import AUDIT_STREAM_KEY, MCP_LISTINGS_KEY, MCP_LISTINGS_VERSION_KEY
from worker.definitions.mcp_tools import Listing
from worker.definitions.model import ToolSet

log = structlog.get_logger("toolworker.definitions")
# Who the audit trail names for the changes a refresh finds.
AUDIT_PRINCIPAL = "toolworker"


def _parsed(raw: Mapping[Any, Any]) -> dict[str, Listing]:
    listings = {}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        try:
            listings[name] = Listing.from_json(value)
        except (ValueError, KeyError) as exc:  # one unreadable listing leaves the others served
            log.error("mcp.listing_unreadable", upstream=name, error=str(exc))
    return listings


def read(client: redis.Redis) -> dict[str, Listing]:
    """Every stored listing, by upstream."""
    return _parsed(cast(Mapping[Any, Any], client.hgetall(MCP_LISTINGS_KEY)))


async def read_async(client: aioredis.Redis) -> dict[str, Listing]:
    raw: Any = await client.hgetall(MCP_LISTINGS_KEY)
    return _parsed(raw)


async def read_one(client: aioredis.Redis, upstream: str) -> Listing | None:
    raw: Any = await client.hget(MCP_LISTINGS_KEY, upstream)
    return None if raw is None else Listing.from_json(raw)


def version(client: redis.Redis) -> int:
    return int(cast(Any, client.get(MCP_LISTINGS_VERSION_KEY)) or 0)


async def write(client: aioredis.Redis, listing: Listing, records: list[dict[str, str]], audit_maxlen: int) -> None:
    """Store a listing (and bump the version readers poll), with its audit records, at once."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(MCP_LISTINGS_KEY, listing.upstream, listing.to_json())
        pipe.incr(MCP_LISTINGS_VERSION_KEY)
        for record in records:
            fields = {"time": _now_iso(), "principal": AUDIT_PRINCIPAL, **record}
            pipe.xadd(AUDIT_STREAM_KEY, cast(Any, fields), maxlen=audit_maxlen, approximate=True)
        await pipe.execute()
    for record in records:
        log.warning("mcp.listing_audited", **record)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


async def follow(
    client: aioredis.Redis,
    seen: int,
    poll_s: float,
    on_change: Callable[[dict[str, Listing]], Awaitable[None] | None],
    wanted: Callable[[], bool],
) -> None:
    """Hand every new set of listings to `on_change`, for as long as the task runs (polling goes on through
    Redis outages); Redis is not asked while `wanted()` says no listing is served (no MCP upstream)."""
    while True:
        await asyncio.sleep(poll_s)
        if not wanted():
            continue
        try:
            current = int(await client.get(MCP_LISTINGS_VERSION_KEY) or 0)
            if current == seen:
                continue
            seen = current
            outcome = on_change(await read_async(client))
            if outcome is not None:
                await outcome
        except RedisError as exc:
            log.warning("mcp.listings_poll_failed", error=str(exc))


def has_mcp(toolset: ToolSet) -> bool:
    """Whether any upstream of the definitions is an MCP server (and so has a listing to serve)."""
    return any(upstream.mcp is not None for upstream in toolset.upstreams.values())
