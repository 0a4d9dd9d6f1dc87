"""Publishing results, exactly once per callId: stored and announced like Celery's Redis backend does."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker import errors
from worker.connections import NotReplicated, execute_replicated
from worker.constants import RESULT_KEY_PREFIX
from worker.envelope import ToolResult, valid_text
from worker.protocol import result_meta
from worker.queue.webhooks import DUE_KEY, record_key, webhook_id
from worker.settings import get_settings

log = structlog.get_logger("toolworker.publisher")

# One script for every result of a flush. KEYS[1]: the webhooks' due set; per result i, KEYS[3i-1]: its result
# key, KEYS[3i]: its reply stream ('' for none), KEYS[3i+1]: its webhook record ('' for none). ARGV[1]: ttl,
# ARGV[2]: stream maxlen, ARGV[3]: now (ms); per result i, ARGV[5i-1]: its Celery meta, ARGV[5i]: its envelope
# ('' when neither a stream nor a webhook takes it), ARGV[5i+1]: its callback URL ('' for none), ARGV[5i+2]: its
# webhook-id, ARGV[5i+3]: its callId. Returns per result 1 (published), 0 (published before: SET NX on the
# result key makes a redelivered call's second publication a no-op) or the error its stream gave (a replyTo key
# that is no stream: the result is stored and announced all the same). A callback's durable record is written
# in the same step (worker/queue/webhooks.py delivers it). A stream's expiry is pushed back once a flush.
_PUBLISH = """
local ttl, maxlen, now, due, out, streams = ARGV[1], ARGV[2], ARGV[3], KEYS[1], {}, {}
for i = 1, (#KEYS - 1) / 3 do
  local key, stream, record = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
  local meta, envelope, url = ARGV[5 * i - 1], ARGV[5 * i], ARGV[5 * i + 1]
  out[i] = 0
  if redis.call('SET', key, meta, 'NX', 'EX', ttl) then
    out[i] = 1
    redis.call('PUBLISH', key, meta)
    if url ~= '' then
      redis.call('HSET', record, 'url', url, 'id', ARGV[5 * i + 2], 'body', envelope, 'first', now, 'attempts', 0)
      redis.call('ZADD', due, now, ARGV[5 * i + 3])
    end
    if stream ~= '' then
      local added = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'envelope', envelope)
      if type(added) == 'table' and added.err then out[i] = added.err else streams[stream] = true end
    end
  end
end
for stream in pairs(streams) do redis.call('EXPIRE', stream, ttl) end
return out
"""
_PUBLISH_SHA = hashlib.sha1(_PUBLISH.encode()).hexdigest()  # loaded into the server on its first NOSCRIPT
# What a failover does to a publication under way: the connection cut (redis-py's asyncio connection, its
# transport aborted mid-write, raises AttributeError), or the promoted primary's replicas not yet there.
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, NotReplicated, AttributeError, OSError)
_RIDE_FAILOVER_S = 30.0  # a failover is over in seconds; past this the message is handed back as before
_RETRY_PAUSE_S = 0.5


# A result to publish: its envelope, its reply stream, its callback URL.
Published = tuple[ToolResult, str | None, str | None]


class Publisher:
    """Stores and announces envelopes: the result key (its presence is the done mark), its channel, the reply
    stream, and the webhook record of a call with a callback."""

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
        async with self.client.pipeline(transaction=False) as pipe:
            for call_id in call_ids:
                pipe.exists(RESULT_KEY_PREFIX + valid_text(call_id))
            flags = await pipe.execute()
        return {c for c, flag in zip(call_ids, flags, strict=True) if flag}

    async def publish(self, results: list[tuple[ToolResult, str | None]]) -> list[bool]:
        """Publish (envelope, replyTo) pairs in one round trip; False where already published. Raises the
        first failure (every other pair was still published)."""
        outcomes = await self._outcomes([(result, reply_to, None) for result, reply_to in results])
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return [bool(o) for o in outcomes]

    async def _outcomes(self, results: list[Published]) -> list[Any]:
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

    async def _sent_once(self, results: list[Published]) -> list[Any]:
        """Each result's outcome (1, 0 or the error its stream gave): one result's failure (a replyTo key that
        is no stream) is its own. Raises when the round trip itself failed."""
        keys: list[str] = [DUE_KEY]
        args: list[Any] = [self._ttl_s, self._stream_maxlen, int(time.time() * 1000)]
        for published in results:
            item_keys, item_args = self._item(*published)
            keys += item_keys
            args += item_args
        reply = await self._evalsha(keys, args)
        if isinstance(reply, NoScriptError):  # a new or flushed server: the script did not run, so run it again
            await self.client.script_load(_PUBLISH)
            reply = await self._evalsha(keys, args)
        if isinstance(reply, Exception):
            return [reply] * len(results)
        return [ResponseError(o.decode(errors="replace")) if isinstance(o, bytes) else o for o in reply]

    def _item(self, result: ToolResult, reply_to: str | None, callback_url: str | None) -> tuple[list[str], list[Any]]:
        """One result's keys and arguments in the publication script."""
        envelope = _serialized(result)
        call_id = valid_text(result.call_id)  # as the envelope names it
        stream = valid_text(reply_to) if reply_to else ""
        if not callback_url:  # the envelope on its own goes to a stream only (the meta holds it too)
            return [RESULT_KEY_PREFIX + call_id, stream, ""], [
                result_meta(call_id, envelope),
                stream and envelope,
                "",
                "",
                "",
            ]
        keys = [RESULT_KEY_PREFIX + call_id, stream, record_key(call_id)]
        return keys, [result_meta(call_id, envelope), envelope, callback_url, webhook_id(call_id), call_id]

    async def _evalsha(self, keys: list[str], args: list[Any]) -> Any:
        """The script's reply, or the error it met. EVALSHA on a plain pipeline: redis-py's Script objects
        would send SCRIPT EXISTS every time."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.evalsha(_PUBLISH_SHA, len(keys), *keys, *args)
            # With MIN_REPLICAS, on that many replicas; the script's own error is its reply.
            (reply,) = await execute_replicated(pipe, raise_on_error=False)
        return reply


def _serialized(result: ToolResult) -> str:
    """The envelope as JSON, whatever it holds: one that cannot be encoded is replaced by an internal
    error envelope for the same call, so that the call is still answered."""
    try:
        return result.to_json()
    except (ValueError, TypeError, RecursionError) as exc:
        log.error("result.unencodable", callId=valid_text(result.call_id), reason=type(exc).__name__)
        error = errors.InternalError("The worker could not encode this call's result; the call may have run.")
        return ToolResult.failure(result.call_id, result.tool, error).to_json()
