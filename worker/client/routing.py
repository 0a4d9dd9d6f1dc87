"""Routing calls to shards: one Link per Redis (its connections, its outbox, its reply reader), the shard
each call went to, and the RedisLost that names the shard a step was waiting for."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.connections import async_client, connect
from worker.errors import RedisLost
from worker.shards import Shard, Shards

T = TypeVar("T")
READ_BLOCK_MS = 1000
# A blocked XREAD answers within READ_BLOCK_MS: a socket silent for longer is a Redis gone away.
_READ_SOCKET_TIMEOUT_S = READ_BLOCK_MS / 1000 + 5
# What a lost Redis looks like from redis-py and from a bounded wait.
_LOST = (RedisConnectionError, RedisTimeoutError, TimeoutError)


@dataclass(eq=False)
class Link:
    """One Redis (a shard, or the only one) as a client uses it: its calls leave through it in one flush
    per loop tick, and their envelopes come back on its copy of the client's reply stream."""

    shard: Shard
    redis: aioredis.Redis
    # XREAD BLOCK holds its connection; the read loop retries by itself, so redis-py must not.
    reader_redis: aioredis.Redis
    # Why the reply stream cannot be read, while it cannot (named when a call fails for it).
    read_error: str | None = None
    reader: asyncio.Task[None] | None = None
    # Calls submitted in the same loop tick leave together: one round trip, batch messages per queue and
    # tenant; the flush's result names the tenants whose calls were refused (max_queued).
    outbox: list[dict[str, Any]] = field(default_factory=list)
    outbox_sent: asyncio.Future[dict[str, int]] | None = None
    flusher: asyncio.Task[None] | None = None
    last_flush: float = -1.0

    @classmethod
    def open(cls, shard: Shard) -> Link:
        reader = async_client(
            shard.url, retry=Retry(NoBackoff(), 0), socket_timeout=_READ_SOCKET_TIMEOUT_S, socket_connect_timeout=5
        )
        return cls(shard, connect(shard.url), reader)


class Routing:
    """A client's links, one per shard: the one a tenant's calls go to, the one each awaited call went to."""

    def __init__(self, shards: Shards) -> None:
        self.shards = shards
        self.links = {shard.name: Link.open(shard) for shard in shards.all}
        # The definitions' routes and the tenants' limits are on the home shard.
        self.home = self.links[shards.home.name]
        self.sent_to: dict[str, Link] = {}  # callId -> the shard it went to, while it is awaited

    def link_of(self, tenant: str) -> Link:
        return self.links[self.shards.of(tenant).name]

    def sent(self, call_ids: Iterable[str], link: Link) -> None:
        for call_id in call_ids:
            self.sent_to[call_id] = link

    def forget(self, call_ids: Iterable[str]) -> None:
        for call_id in call_ids:
            self.sent_to.pop(call_id, None)

    async def bounded(self, step: Awaitable[T], timeout_s: float, doing: str, link: Link | None = None) -> T:
        """A step that needs Redis, within `timeout_s`; RedisLost when Redis is gone or does not answer
        in time (redis-py alone would retry a lost server for a minute or more)."""
        try:
            return await asyncio.wait_for(step, timeout_s)
        except _LOST as exc:
            raise self.lost(doing, exc, timeout_s, link) from exc

    def lost(self, doing: str, exc: BaseException, timeout_s: float, link: Link | None = None) -> RedisLost:
        """The error for a step that Redis did not let finish, with the best reason known; it names the
        shard (or the one Redis) it was waiting for."""
        link = link or self.home
        reason = one_line(exc) or link.read_error or f"no answer within {timeout_s:g} s"
        return RedisLost(f"lost Redis at {link.shard.where} {doing} ({reason})")

    async def close(self) -> None:
        for link in self.links.values():
            await link.redis.aclose()
            await link.reader_redis.aclose()


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
