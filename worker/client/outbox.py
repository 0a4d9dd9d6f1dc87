"""Sending calls: those submitted in one loop tick leave a shard in one flush, as batch messages per queue
(the bulkheads' routes) and tenant (its scheduler's lists and limits)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisError

from worker.client.routing import Link
from worker.connections import execute_replicated
from worker.constants import CLIENT_SLACK_S, DEFAULT_TENANT, TENANT_LIMITS_KEY
from worker.definitions.redis_store import read_routes
from worker.protocol import task_messages
from worker.queue import scheduler
from worker.settings import get_settings

_ROUTES_TTL_S = 10.0
# How long a flush waits for more calls when the previous flush was this recent (a stream of submits).
_LINGER_S = 0.001


class Outbox:
    """Flushes each link's outbox; the routes and the tenants' limits come from the home shard."""

    def __init__(self, home: Link, queue: str, max_batch: int, *, one_shard: bool) -> None:
        self._home = home
        self._queue = queue
        self._max_batch = max_batch
        self._one_shard = one_shard  # its routes are kept only while there are other shards to serve
        self._routes: dict[str, str] = {}
        self._limits: dict[Any, Any] = {}
        self._routes_at = -_ROUTES_TTL_S

    async def send(self, link: Link, messages: list[dict[str, Any]]) -> dict[str, int]:
        """Put calls in the link's outbox and wait for its flush; the tenants refused (max_queued), with
        their limits."""
        link.outbox.extend(messages)
        if link.outbox_sent is None:
            loop = asyncio.get_running_loop()
            link.outbox_sent = loop.create_future()
            link.flusher = loop.create_task(self._flush(link))  # referenced: a bare task may be collected
        return await asyncio.shield(link.outbox_sent)

    async def drain(self, links: Iterable[Link]) -> None:
        """Calls submitted just before closing still leave, unless Redis is gone."""
        flushers = {link.flusher for link in links if link.flusher is not None}
        if flushers:
            await asyncio.wait(flushers, timeout=CLIENT_SLACK_S)
            for flusher in flushers:  # and awaited: a task left to the loop's end leaves redis-py's cleanup undone
                flusher.cancel()
            await asyncio.wait(flushers, timeout=CLIENT_SLACK_S)

    async def _flush(self, link: Link) -> None:
        # Concurrent submitters join this flush: for one tick, or a little longer when calls come in a stream.
        busy = time.monotonic() - link.last_flush < _LINGER_S
        await asyncio.sleep(_LINGER_S if busy else 0)
        link.last_flush = time.monotonic()
        messages, link.outbox = link.outbox, []
        sent, link.outbox_sent = link.outbox_sent, None
        assert sent is not None
        try:
            groups = await self._grouped(messages)
            # With MIN_REPLICAS the pipeline is sent again after a failover: each push is made once.
            once = uuid.uuid4().hex if get_settings().redis_min_replicas else None
            async with link.redis.pipeline(transaction=False) as pipe:
                for index, ((queue, tenant), calls) in enumerate(groups.items()):
                    bodies = task_messages(calls, queue, self._batch_size(tenant))
                    scheduler.enqueue(pipe, queue, tenant, bodies, len(calls), once and f"{once}:{index}")
                replies = await execute_replicated(pipe)  # with MIN_REPLICAS, raises NotReplicated on a shortfall
        except Exception as exc:  # every waiting submitter sees the failure
            sent.set_exception(exc)
        else:
            refused = {group[1]: scheduler.refused_limit(reply) for group, reply in zip(groups, replies, strict=True)}
            sent.set_result({tenant: limit for tenant, limit in refused.items() if limit is not None})

    async def _grouped(self, messages: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """Group calls by the queue of their tool's upstream (bulkheads) and their tenant; the routes and
        the tenants' limits are refreshed every 10 s (kept while the home shard does not answer)."""
        if time.monotonic() - self._routes_at > _ROUTES_TTL_S:
            try:
                self._routes = await read_routes(self._home.redis)
                self._limits = await self._home.redis.hgetall(TENANT_LIMITS_KEY)
            except RedisError:
                if self._routes_at < 0 or self._one_shard:
                    raise
            self._routes_at = time.monotonic()
        grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for message in messages:
            key = (self._routes.get(message["tool"], self._queue), message.get("tenant", DEFAULT_TENANT))
            grouped.setdefault(key, []).append(message)
        return grouped

    def _batch_size(self, tenant: str) -> int:
        """A tenant with a max_in_flight gets batches no larger: a batch's calls run at once."""
        cap = scheduler.limits_of(self._limits, tenant).max_in_flight
        return min(self._max_batch, cap) if cap else self._max_batch
