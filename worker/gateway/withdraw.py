"""Withdrawing a call that no worker has taken yet (an MCP request cancelled, `DELETE /v1/calls/{id}`).

A waiting call is a Celery message in its queue's Redis list: alone (`toolcall.execute`), or one of a
batch (`toolcall.execute_batch`) that the client sent with the calls of the same moment. A lone call's
message is removed with `LREM`; a batch is replaced by the same batch without the call, in one
`MULTI` (`LINSERT` the new message before the old one, `LREM` the old one: when a worker took the old
one meanwhile, neither changes anything). A call already taken runs to its end.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from worker.constants import DEFAULT_QUEUE, DEFAULT_TENANT
from worker.definitions.redis_store import read_routes
from worker.protocol import call_id_needle, without_call
from worker.queue import scheduler

# The waiting messages looked through, newest first (a call further back is about to be taken anyway).
SCAN_LIMIT = 10_000


async def withdraw(
    client: aioredis.Redis,
    tool: str,
    call_id: str,
    tenant: str = DEFAULT_TENANT,
    routes: aioredis.Redis | None = None,
) -> bool:
    """Take the call off its queue (its tenant's list there, on `client`: the tenant's shard); False when it
    is not waiting there (started, answered or unknown). The tenant's count of calls waiting goes down by
    one. The routes are read from `routes` (the home shard) when given."""
    if not await _take_off(client, tool, call_id, tenant, routes or client):
        return False
    await client.hincrby(scheduler.QUEUED_KEY, tenant, -1)
    return True


async def _take_off(client: aioredis.Redis, tool: str, call_id: str, tenant: str, routes: aioredis.Redis) -> bool:
    queue = scheduler.tenant_list((await read_routes(routes)).get(tool, DEFAULT_QUEUE), tenant)
    needle = call_id_needle(call_id)
    raw_messages: list[Any] = await client.lrange(queue, 0, SCAN_LIMIT - 1)
    for raw in raw_messages:
        if needle not in raw:
            continue
        found, rest = without_call(raw, call_id)
        if not found:
            continue
        if rest is None:
            return bool(await client.lrem(queue, 1, raw))
        async with client.pipeline(transaction=True) as pipe:
            pipe.linsert(queue, "BEFORE", raw, rest)
            pipe.lrem(queue, 1, raw)
            inserted, removed = await pipe.execute()
        return bool(inserted > 0 and removed)
    return False
