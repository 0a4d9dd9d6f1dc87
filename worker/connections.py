"""Connections to Redis for our own keys (results, reply streams, rate limits, the shared store)."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def connect(url: str, max_connections: int = 32) -> aioredis.Redis:
    """A client that rides out a Redis restart (reconnects with backoff for about a minute) and
    queues for a connection under load instead of failing."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=30,
        retry=Retry(ExponentialWithJitterBackoff(cap=5.0, base=0.1), retries=20),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionResetError],
        health_check_interval=30,
        socket_keepalive=True,
    )
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes its connections
