"""Publishing results, exactly once per callId: stored and announced like Celery's Redis backend does."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import NoScriptError

from worker import errors
from worker.connections import execute_replicated
from worker.constants import DONE_KEY_PREFIX, RESULT_KEY_PREFIX
from worker.envelope import ToolResult, valid_text
from worker.protocol import result_meta
from worker.queue.webhooks import DUE_KEY, record_key, webhook_id

log = structlog.get_logger("toolworker.publisher")

# KEYS: done marker, result key, webhook record, webhook due set, reply stream (optional). ARGV: meta, ttl,
# envelope, stream maxlen, callback URL ('' for none), webhook-id, now (ms), callId. SET NX on the marker makes a
# redelivered call's second publication a no-op; a callback's durable record is written in the same step
# (worker/queue/webhooks.py delivers it).
_PUBLISH = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
redis.call('PUBLISH', KEYS[2], ARGV[1])
if KEYS[5] then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 'envelope', ARGV[3])
  redis.call('EXPIRE', KEYS[5], ARGV[2])
end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[3], 'url', ARGV[5], 'id', ARGV[6], 'body', ARGV[3], 'first', ARGV[7], 'attempts', 0)
  redis.call('ZADD', KEYS[4], ARGV[7], ARGV[8])
end
return 1
"""
_PUBLISH_SHA = hashlib.sha1(_PUBLISH.encode()).hexdigest()  # loaded into the server on its first NOSCRIPT


# A result to publish: its envelope, its reply stream, its callback URL.
Published = tuple[ToolResult, str | None, str | None]


class Publisher:
    """Stores and announces envelopes: the result key, its channel, the done marker, the reply stream, and
    the webhook record of a call with a callback."""

    def __init__(
        self, client: aioredis.Redis, ttl_s: int, stream_maxlen: int, on_callback: Callable[[], None] | None = None
    ) -> None:
        self.client = client
        self._ttl_s = ttl_s
        self._stream_maxlen = stream_maxlen
        # Told when a published result left a webhook to deliver (the deliveries claim it at once).
        self._on_callback = on_callback
        # Results finished in the same loop tick share one round trip.
        self._pending: list[tuple[Published, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def publish_one(self, result: ToolResult, reply_to: str | None, callback_url: str | None = None) -> bool:
        """Publish one result (and record its webhook, with a callback URL), pipelined with the others of this
        tick; False if it was published before."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append(((result, reply_to, callback_url), future))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # one tick: results finishing together join this round trip
        items, self._pending, self._flusher = self._pending, [], None
        try:
            outcomes = await self._outcomes([published for published, _ in items])
        except Exception as exc:  # each caller sees the failure and decides
            outcomes = [exc] * len(items)
        for (_, future), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(bool(outcome))
        if self._on_callback is not None and any(p[2] and o == 1 for (p, _), o in zip(items, outcomes, strict=True)):
            self._on_callback()

    async def already_done(self, call_ids: list[str]) -> set[str]:
        """The calls of this list whose result was published already (a redelivered message)."""
        if not call_ids:
            return set()
        flags = await self.client.mget([DONE_KEY_PREFIX + valid_text(c) for c in call_ids])
        return {c for c, flag in zip(call_ids, flags, strict=True) if flag is not None}

    async def publish(self, results: list[tuple[ToolResult, str | None]]) -> list[bool]:
        """Publish (envelope, replyTo) pairs in one round trip; False where already published. Raises the
        first failure (every other pair was still published)."""
        outcomes = await self._outcomes([(result, reply_to, None) for result, reply_to in results])
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return [bool(o) for o in outcomes]

    async def _outcomes(self, results: list[Published]) -> list[Any]:
        """Each result's outcome (1, 0 or the error its script met): one result's failure (a replyTo key that
        is no stream) is its own. Raises when the round trip itself failed."""
        calls = [self._script_call(*published) for published in results]
        outcomes = await self._evalsha(calls)
        unloaded = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, NoScriptError)]
        if unloaded:  # a new or flushed server: those scripts did not run, so running them again is safe
            await self.client.script_load(_PUBLISH)
            for i, outcome in zip(unloaded, await self._evalsha([calls[i] for i in unloaded]), strict=True):
                outcomes[i] = outcome
        return outcomes

    def _script_call(self, result: ToolResult, reply_to: str | None, callback_url: str | None) -> list[Any]:
        envelope = _serialized(result)
        call_id = valid_text(result.call_id)  # as the envelope names it
        keys = [DONE_KEY_PREFIX + call_id, RESULT_KEY_PREFIX + call_id, record_key(call_id), DUE_KEY]
        if reply_to:
            keys.append(valid_text(reply_to))
        meta = result_meta(call_id, envelope)
        webhook = (
            [callback_url, webhook_id(call_id), int(time.time() * 1000), call_id] if callback_url else ["", "", 0, ""]
        )
        return [len(keys), *keys, meta, self._ttl_s, envelope, self._stream_maxlen, *webhook]

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
