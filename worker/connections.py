"""Connections to Redis for our own keys (results, reply streams, rate limits, the shared store)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.redaction import mask_url


class RedisUnavailable(Exception):
    """Redis cannot be used with these settings; the message says why, with the password masked."""


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


def check_reachable(url: str, timeout_s: float) -> None:
    """One PING, not retried: a command that starts (a worker, a call) fails at once with the true reason,
    where a client that rides out restarts would retry a wrong password or address for a minute or more."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=None)
    where = mask_url(url)
    try:
        client.ping()
    except AuthenticationError as exc:
        raise RedisUnavailable(f"authentication failed at {where}: {_one_line(exc)}") from None
    except ResponseError as exc:  # a password given to a server that has none, a user without PING...
        raise RedisUnavailable(f"Redis at {where} refused the connection: {_one_line(exc)}") from None
    except (RedisConnectionError, RedisTimeoutError, OSError, ValueError) as exc:
        raise RedisUnavailable(f"cannot reach Redis at {where} within {timeout_s:g} s: {_one_line(exc)}") from None
    finally:
        client.close()


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:300]
