"""Publishing results, exactly once per callId: stored and announced like Celery's Redis backend does."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker import errors
from worker.connections import NotReplicated, execute_replicated
from worker.constants import DONE_KEY_PREFIX, RESULT_KEY_PREFIX
from worker.envelope import ToolResult, valid_text
from worker.protocol import result_meta
from worker.settings import get_settings

log = structlog.get_logger("toolworker.publisher")

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
_PUBLISH_SHA = hashlib.sha1(_PUBLISH.encode()).hexdigest()  # loaded into the server on its first NOSCRIPT
# What a failover does to a publication under way: the connection cut (redis-py's asyncio connection, its
# transport aborted mid-write, raises AttributeError), or the promoted primary's replicas not yet there.
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, NotReplicated, AttributeError, OSError)
_RIDE_FAILOVER_S = 30.0  # a failover is over in seconds; past this the message is handed back as before
_RETRY_PAUSE_S = 0.5


class Publisher:
    """Stores and announces envelopes: the result key, its channel, the done marker, the reply stream."""

    def __init__(self, client: aioredis.Redis, ttl_s: int, stream_maxlen: int) -> None:
        self.client = client
        self._ttl_s = ttl_s
        self._stream_maxlen = stream_maxlen
        # Results finished in the same loop tick share one round trip.
        self._pending: list[tuple[ToolResult, str | None, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def publish_one(self, result: ToolResult, reply_to: str | None) -> bool:
        """Publish one result, pipelined with the others of this tick; False if it was published before."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((result, reply_to, future))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # one tick: results finishing together join this round trip
        items, self._pending, self._flusher = self._pending, [], None
        try:
            outcomes = await self._outcomes([(result, reply_to) for result, reply_to, _ in items])
        except Exception as exc:  # each caller sees the failure and decides
            outcomes = [exc] * len(items)
        for (_, _, future), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(bool(outcome))

    async def already_done(self, call_ids: list[str]) -> set[str]:
        """The calls of this list whose result was published already (a redelivered message)."""
        if not call_ids:
            return set()
        flags = await self.client.mget([DONE_KEY_PREFIX + valid_text(c) for c in call_ids])
        return {c for c, flag in zip(call_ids, flags, strict=True) if flag is not None}

    async def publish(self, results: list[tuple[ToolResult, str | None]]) -> list[bool]:
        """Publish (envelope, replyTo) pairs in one round trip; False where already published. Raises the
        first failure (every other pair was still published)."""
        outcomes = await self._outcomes(results)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return [bool(o) for o in outcomes]

    async def _outcomes(self, results: list[tuple[ToolResult, str | None]]) -> list[Any]:
        """`_sent_once`, sent again while a failover is under way (MIN_REPLICAS): a call that ran keeps its
        result rather than running again, and the script makes a second publication a no-op."""
        deadline = time.monotonic() + _RIDE_FAILOVER_S
        while True:
            try:
                return await self._sent_once(results)
            except _TRANSIENT as exc:
                if not get_settings().redis_min_replicas or time.monotonic() > deadline:
                    raise
                log.warning("result.publish_retried", reason=f"{type(exc).__name__}: {str(exc)[:200]}")
                await asyncio.sleep(_RETRY_PAUSE_S)

    async def _sent_once(self, results: list[tuple[ToolResult, str | None]]) -> list[Any]:
        """Each pair's outcome (1, 0 or the error its script met): one pair's failure (a replyTo key that
        is no stream) is its own. Raises when the round trip itself failed."""
        calls = [self._script_call(result, reply_to) for result, reply_to in results]
        outcomes = await self._evalsha(calls)
        unloaded = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, NoScriptError)]
        if unloaded:  # a new or flushed server: those scripts did not run, so running them again is safe
            await self.client.script_load(_PUBLISH)
            for i, outcome in zip(unloaded, await self._evalsha([calls[i] for i in unloaded]), strict=True):
                outcomes[i] = outcome
        return outcomes

    def _script_call(self, result: ToolResult, reply_to: str | None) -> list[Any]:
        envelope = _serialized(result)
        call_id = valid_text(result.call_id)  # as the envelope names it
        keys = [DONE_KEY_PREFIX + call_id, RESULT_KEY_PREFIX + call_id]
        if reply_to:
            keys.append(valid_text(reply_to))
        return [len(keys), *keys, result_meta(call_id, envelope), self._ttl_s, envelope, self._stream_maxlen]

    async def _evalsha(self, calls: list[list[Any]]) -> list[Any]:
        # EVALSHA on a plain pipeline: redis-py's Script objects would send SCRIPT EXISTS every time.
        async with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.evalsha(_PUBLISH_SHA, *call)
            # With MIN_REPLICAS, on that many replicas; each call's own outcome, an error included.
            outcomes = await execute_replicated(pipe, raise_on_error=False)
        return outcomes


def _serialized(result: ToolResult) -> str:
    """The envelope as JSON, whatever it holds: one that cannot be encoded is replaced by an internal
    error envelope for the same call, so that the call is still answered."""
    try:
        return result.to_json()
    except (ValueError, TypeError, RecursionError) as exc:
        log.error("result.unencodable", callId=valid_text(result.call_id), reason=type(exc).__name__)
        error = errors.InternalError("The worker could not encode this call's result; the call may have run.")
        return ToolResult.failure(result.call_id, result.tool, error).to_json()
