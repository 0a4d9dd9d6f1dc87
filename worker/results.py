"""Publishing results, exactly once per callId: stored and announced like Celery's Redis backend does."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.constants import DONE_KEY_PREFIX, RESULT_KEY_PREFIX
from worker.envelope import ToolResult
from worker.protocol import result_meta

# KEYS: done marker, result key, reply stream (optional). ARGV: meta, ttl, envelope, stream maxlen.
# SET NX on the marker makes a redelivered call's second publication a no-op.
_PUBLISH = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
redis.call('PUBLISH', KEYS[2], ARGV[1])
if KEYS[3] then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'envelope', ARGV[3])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
return 1
"""


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


class Publisher:
    def __init__(self, client: aioredis.Redis, ttl_s: int, stream_maxlen: int) -> None:
        self.client = client
        self._ttl_s = ttl_s
        self._stream_maxlen = stream_maxlen
        self._script = client.register_script(_PUBLISH)

    async def already_done(self, call_ids: list[str]) -> set[str]:
        """The calls of this list whose result was published already (a redelivered message)."""
        if not call_ids:
            return set()
        flags = await self.client.mget([DONE_KEY_PREFIX + c for c in call_ids])
        return {c for c, flag in zip(call_ids, flags, strict=True) if flag is not None}

    async def publish(self, results: list[tuple[ToolResult, str | None]]) -> list[bool]:
        """Publish (envelope, replyTo) pairs in one round trip; False where already published."""
        async with self.client.pipeline(transaction=False) as pipe:
            for result, reply_to in results:
                envelope = result.to_dict()
                keys = [DONE_KEY_PREFIX + result.call_id, RESULT_KEY_PREFIX + result.call_id]
                if reply_to:
                    keys.append(reply_to)
                args: list[Any] = [
                    result_meta(result.call_id, envelope),
                    self._ttl_s,
                    json.dumps(envelope, ensure_ascii=False),
                    self._stream_maxlen,
                ]
                await self._script(keys=keys, args=args, client=pipe)
            outcomes = await pipe.execute()
        return [bool(o) for o in outcomes]
