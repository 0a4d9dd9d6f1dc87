"""ToolClient: enqueue tool calls and wait for their envelopes (sync and asyncio).

One implementation, `AsyncToolClient`, on redis.asyncio: calls are LPUSHed as Celery protocol 2
messages; each client reads its results from its own reply stream (a Redis stream survives a
reconnect, where pub/sub would drop what was sent meanwhile). `ToolClient` runs the same code on a
background loop for synchronous callers. With shards, a call goes to its tenant's shard, and the reply
stream is read on every shard the client sent to.

A call's timeout bounds the caller's wait: past it, the result store is read once, within
CLIENT_SLACK_S; a Redis that does not answer by then raises RedisLost (a Redis back in time is used).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker import tracing
from worker.connections import async_client, connect, execute_replicated
from worker.constants import (
    CLIENT_SLACK_S,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_QUEUE,
    DEFAULT_TENANT,
    MAX_CALL_TIMEOUT_S,
    RESULT_KEY_PREFIX,
    TENANT_LIMITS_KEY,
    TENANT_PATTERN,
)
from worker.definitions.redis_store import read_routes
from worker.envelope import ToolResult
from worker.errors import RedisLost, TenantQueueFull
from worker.http.egress import EgressPolicy, check_callback
from worker.loop import LoopThread
from worker.protocol import envelope_from_meta, task_messages
from worker.queue import scheduler
from worker.settings import get_settings
from worker.shards import Shard, Shards

T = TypeVar("T")
_READ_BLOCK_MS = 1000
_ROUTES_TTL_S = 10.0
# How long a flush waits for more calls when the previous flush was this recent (a stream of submits).
_LINGER_S = 0.001
_READ_COUNT = 1000
# A blocked XREAD answers within _READ_BLOCK_MS: a socket silent for longer is a Redis gone away.
_READ_SOCKET_TIMEOUT_S = _READ_BLOCK_MS / 1000 + 5
# Envelopes read are trimmed off the reply stream once this many are there (one command for many calls).
_TRIM_EVERY = 64
# The synchronous client's last resort, should the loop itself not answer (the async code bounds every wait).
_SYNC_GUARD_S = 5.0
# What a lost Redis looks like from redis-py and from a bounded wait.
_LOST = (RedisConnectionError, RedisTimeoutError, TimeoutError)

CallSpec = tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], Mapping[str, str]]


@dataclass(eq=False)
class _Link:
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
    def open(cls, shard: Shard) -> _Link:
        reader = async_client(
            shard.url, retry=Retry(NoBackoff(), 0), socket_timeout=_READ_SOCKET_TIMEOUT_S, socket_connect_timeout=5
        )
        return cls(shard, connect(shard.url), reader)


class AsyncToolClient:
    """Calls for any tenant; with shards (`shards=`, else TOOLWORKER_REDIS_SHARDS when no URL is given),
    each goes to its tenant's shard (worker/shards.py) and is answered there."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        shards: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_batch: int = 100,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        if shards is not None:
            self.shards = Shards.parse(shards)
        else:
            self.shards = Shards.single(redis_url) if redis_url else get_settings().shards
        self._max_batch = max_batch
        self.tenant = checked_tenant(tenant)
        self._links = {shard.name: _Link.open(shard) for shard in self.shards.all}
        # The definitions' routes and the tenants' limits are on the home shard.
        self._home = self._links[self.shards.home.name]
        self._closing = False
        self._queue = queue
        self.reply_stream = f"toolworker:replies:{uuid.uuid4().hex}"
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._sent_to: dict[str, _Link] = {}  # callId -> the shard it went to, while it is awaited
        self._routes: dict[str, str] = {}
        self._limits: dict[Any, Any] = {}
        self._routes_at = -_ROUTES_TTL_S

    async def acall(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> ToolResult:
        """One call; `user` names whom it acts for (the vault's tokens of `oauth2_user` upstreams), `callback_url`
        where its envelope is POSTed once published (signed, Standard Webhooks)."""
        specs: list[CallSpec] = [(tool, arguments or {}, headers or {})]
        return (await self.acall_many(specs, timeout=timeout, tenant=tenant, user=user, callback_url=callback_url))[0]

    async def acall_many(
        self,
        calls: Sequence[CallSpec],
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> list[ToolResult]:
        """Run many calls as one message; results come back in order. Raises RedisLost (naming the shard)
        when Redis does not answer within `timeout` plus CLIENT_SLACK_S."""
        _check_timeout(timeout)  # before it bounds anything
        started = time.monotonic()
        link = self._link_of(tenant)
        enqueue = self.submit_many(calls, timeout=timeout, tenant=tenant, user=user, callback_url=callback_url)
        doing = "while enqueuing the call (it may be enqueued all the same)"
        call_ids = await self._bounded(enqueue, timeout, doing, link)
        wait_s = max(0.0, started + timeout - time.monotonic())
        return await self._collect(call_ids, [spec[0] for spec in calls], wait_s, timeout)

    async def submit_many(
        self,
        calls: Sequence[CallSpec],
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        call_ids: Sequence[str] | None = None,
        trace: Mapping[str, str] | None = None,
        tenant: str | None = None,
        principal: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> list[str]:
        """Enqueue calls and return their callIds; each call's envelope can be awaited on its own. The
        calls carry the active span's trace context (OpenTelemetry), else `trace` when given; they are
        for `tenant` (the client's own when None), made by `principal` when one is named (the gateway).
        With `callback_url`, each envelope is also POSTed there once published (signed webhooks); raises
        CallbackRefused (an EgressBlocked) when TOOLWORKER_CALLBACK_ALLOW does not allow it.
        Raises TenantQueueFull, enqueuing none of them, when the tenant has its max_queued calls waiting."""
        _check_timeout(timeout)
        if callback_url is not None:
            check_callback(EgressPolicy.parse(get_settings().callback_allow), callback_url)
        tenant = self.tenant if tenant is None else checked_tenant(tenant)
        link = self._link_of(tenant)
        self._ensure_reader(link)
        common = self._common(timeout, trace, tenant, principal, user, callback_url)
        ids = call_ids or [str(uuid.uuid4()) for _ in calls]
        messages = [_message(spec, call_id, common) for spec, call_id in zip(calls, ids, strict=True)]
        loop = asyncio.get_running_loop()
        for message in messages:
            self._waiting[message["callId"]] = loop.create_future()
            self._sent_to[message["callId"]] = link
        link.outbox.extend(messages)
        if link.outbox_sent is None:
            link.outbox_sent = loop.create_future()
            link.flusher = loop.create_task(self._flush(link))  # referenced: a bare task may be collected
        sent = link.outbox_sent
        try:
            refused = await asyncio.shield(sent)
            if tenant in refused:
                raise TenantQueueFull(tenant, refused[tenant])
        except BaseException:  # not enqueued (or the caller gave up): nothing will answer these
            self._forget(message["callId"] for message in messages)
            raise
        return [m["callId"] for m in messages]

    def redis_of(self, tenant: str) -> aioredis.Redis:
        """The client of a tenant's shard (its parked calls, its results)."""
        return self._link_of(tenant).redis

    def shard_clients(self) -> list[aioredis.Redis]:
        """A client on each shard, the home one first."""
        return [link.redis for link in self._links.values()]

    def _link_of(self, tenant: str | None) -> _Link:
        return self._links[self.shards.of(self.tenant if tenant is None else tenant).name]

    def _forget(self, call_ids: Iterable[str]) -> None:
        for call_id in call_ids:
            self._waiting.pop(call_id, None)
            self._sent_to.pop(call_id, None)

    def _common(
        self,
        timeout: float,
        trace: Mapping[str, str] | None,
        tenant: str,
        principal: str | None,
        user: str | None,
        callback_url: str | None,
    ) -> dict[str, Any]:
        """The fields every call of one submission carries."""
        now = datetime.now(UTC)
        common: dict[str, Any] = {
            "timeoutSeconds": timeout,
            "deadline": (now + timedelta(seconds=timeout)).isoformat(),
            "enqueuedAt": now.isoformat(),
            "replyTo": self.reply_stream,
            **(tracing.current_context() or trace or {}),
        }
        optional = {
            "tenant": None if tenant == DEFAULT_TENANT else tenant,
            "principal": principal,
            "user": None if user is None else checked_user(user),
            "callback": None if callback_url is None else {"url": callback_url},
        }
        return common | {key: value for key, value in optional.items() if value is not None}

    async def _flush(self, link: _Link) -> None:
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
                if self._routes_at < 0 or len(self._links) == 1:
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

    async def result(self, call_id: str, timeout: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """The envelope of a call; raises TimeoutError when it does not come in time (RedisLost when Redis
        does not answer either). A call submitted by another client is looked for on every shard."""
        future = self._waiting.get(call_id)
        if future is None:  # not submitted by this client: read the stored result
            return await self._poll_stored(call_id, timeout)
        try:
            envelope = await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            stored = await self._stored_within(call_id, CLIENT_SLACK_S)
            if stored is None:
                raise TimeoutError(f"no result for call {call_id} within {timeout:g} s") from None
            envelope = stored
        finally:  # answered or given up on: a long-lived client keeps no entry behind
            self._forget([call_id])
        return ToolResult.from_dict(envelope)

    async def tools(self, tags: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Light summaries of the tools the workers serve (through the queue, like any call)."""
        return list(await self._catalog("catalog_list", {"tags": list(tags)} if tags else {}))

    async def schema(self, names: Sequence[str]) -> dict[str, Any]:
        """Full definitions of the named tools, and the names that are missing."""
        return dict(await self._catalog("catalog_schema", {"names": list(names)}))

    async def search(self, question: str, top_k: int = 5) -> list[dict[str, Any]]:
        """The tools that best match a question, best first."""
        return list(await self._catalog("catalog_search", {"question": question, "top_k": top_k}))

    async def _catalog(self, tool: str, arguments: dict[str, Any]) -> Any:
        result = await self.acall(tool, arguments)
        if result.exit_code:
            raise RuntimeError(f"{tool} failed: {(result.error or {}).get('message')}")
        return json.loads(result.result)

    async def aclose(self) -> None:
        flushers = {link.flusher for link in self._links.values() if link.flusher is not None}
        if flushers:  # calls submitted just before closing still leave, unless Redis is gone
            await asyncio.wait(flushers, timeout=CLIENT_SLACK_S)
            for flusher in flushers:  # and awaited: a task left to the loop's end leaves redis-py's cleanup undone
                flusher.cancel()
            await asyncio.wait(flushers, timeout=CLIENT_SLACK_S)
        # A blocked XREAD does not honour cancellation promptly: drop its connection instead.
        self._closing = True
        for link in self._links.values():
            await link.reader_redis.connection_pool.disconnect()
        readers = {link.reader for link in self._links.values() if link.reader is not None}
        if readers:
            await asyncio.wait(readers, timeout=_READ_BLOCK_MS / 1000 + 1)
            for reader in readers:
                reader.cancel()
        for link in self._links.values():
            await link.redis.aclose()
            await link.reader_redis.aclose()

    async def _collect(self, call_ids: list[str], tools: list[str], wait_s: float, timeout: float) -> list[ToolResult]:
        """The envelopes of calls submitted here, in order, waited for together (one timer, no task each).
        A call still unanswered after `wait_s` is read from the result store, else ends with 28."""
        futures = [self._waiting[call_id] for call_id in call_ids]
        try:
            pending = [future for future in futures if not future.done()]
            if pending:
                await asyncio.wait(pending, timeout=wait_s)
            late = [call_id for call_id, future in zip(call_ids, futures, strict=True) if not future.done()]
            stored = await self._stored_many(late, CLIENT_SLACK_S, "while waiting for results") if late else []
            stored_by_id = dict(zip(late, stored, strict=True))
            results = []
            for call_id, tool, future in zip(call_ids, tools, futures, strict=True):
                envelope = future.result() if future.done() else stored_by_id[call_id]
                results.append(
                    ToolResult.from_dict(envelope) if envelope is not None else _unanswered(call_id, tool, timeout)
                )
            return results
        finally:  # also when the caller is cancelled: a long-lived client keeps no entry behind
            self._forget(call_ids)

    def _ensure_reader(self, link: _Link) -> None:
        """Replies are read from a shard once a call went there (an idle shard is not polled)."""
        if link.reader is None or link.reader.done():
            link.reader = asyncio.get_running_loop().create_task(self._read_replies(link))

    async def _read_replies(self, link: _Link) -> None:
        last_id, read_kept = "0-0", 0
        while not self._closing:
            try:
                answer: Any = await link.reader_redis.xread(
                    {self.reply_stream: last_id}, count=_READ_COUNT, block=_READ_BLOCK_MS
                )
            except RedisError as exc:
                link.read_error = _one_line(exc)
                if not self._closing:
                    await asyncio.sleep(0.5)  # Redis is away: try again without spinning
                continue
            link.read_error = None
            for _stream, entries in answer or []:
                for entry_id, fields in entries:
                    last_id, read_kept = entry_id, read_kept + 1
                    self._deliver(json.loads(fields[b"envelope"]))
            if read_kept >= _TRIM_EVERY:  # what was read leaves the stream, a few dozen at a time
                await link.reader_redis.xtrim(self.reply_stream, minid=last_id, approximate=False)
                read_kept = 0

    def _deliver(self, envelope: dict[str, Any]) -> None:
        future = self._waiting.get(str(envelope.get("callId")))
        if future is not None and not future.done():
            future.set_result(envelope)

    async def _stored_many(self, call_ids: list[str], timeout_s: float, doing: str) -> list[dict[str, Any] | None]:
        """The stored envelopes of these calls, read within `timeout_s` from the shard each went to (else
        RedisLost naming it); calls not sent from here are looked for on every shard."""
        by_link: dict[_Link | None, list[str]] = {}
        for call_id in call_ids:
            by_link.setdefault(self._sent_to.get(call_id), []).append(call_id)
        found: dict[str, dict[str, Any] | None] = {}
        for link, ids in by_link.items():
            if link is None:
                found |= await self._stored_anywhere(ids, timeout_s, doing)
            else:
                found |= zip(ids, await self._bounded(_stored_on(link, ids), timeout_s, doing, link), strict=True)
        return [found[call_id] for call_id in call_ids]

    async def _stored_anywhere(self, call_ids: list[str], timeout_s: float, doing: str) -> dict[str, Any]:
        """Envelopes looked for on every shard at once: a shard that does not answer is passed over (its
        calls look unanswered) unless none answers."""
        links = list(self._links.values())
        reads = (self._bounded(_stored_on(link, call_ids), timeout_s, doing, link) for link in links)
        outcomes = await asyncio.gather(*reads, return_exceptions=True)
        answers = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
        if not answers:
            raise next(outcome for outcome in outcomes if isinstance(outcome, BaseException))
        by_call = zip(call_ids, *answers, strict=True)
        return {call_id: next(filter(None, envelopes), None) for call_id, *envelopes in by_call}

    async def _stored_within(self, call_id: str, timeout_s: float) -> dict[str, Any] | None:
        return (await self._stored_many([call_id], timeout_s, f"while waiting for the result of call {call_id}"))[0]

    async def _bounded(self, step: Awaitable[T], timeout_s: float, doing: str, link: _Link | None = None) -> T:
        """A step that needs Redis, within `timeout_s`; RedisLost when Redis is gone or does not answer
        in time (redis-py alone would retry a lost server for a minute or more)."""
        try:
            return await asyncio.wait_for(step, timeout_s)
        except _LOST as exc:
            raise self.lost(doing, exc, timeout_s, link) from exc

    def lost(self, doing: str, exc: BaseException, timeout_s: float, link: _Link | None = None) -> RedisLost:
        """The error for a step that Redis did not let finish, with the best reason known; it names the
        shard (or the one Redis) it was waiting for."""
        link = link or self._home
        reason = _one_line(exc) or link.read_error or f"no answer within {timeout_s:g} s"
        return RedisLost(f"lost Redis at {link.shard.where} {doing} ({reason})")

    def link_of_call(self, call_id: str) -> _Link | None:
        return self._sent_to.get(call_id)

    async def _poll_stored(self, call_id: str, timeout: float) -> ToolResult:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            left_s = max(0.0, deadline - time.monotonic())
            envelope = await self._stored_within(call_id, left_s + CLIENT_SLACK_S)
            if envelope is not None:
                return ToolResult.from_dict(envelope)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no result for call {call_id} within {timeout:g} s")
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)


def _check_timeout(timeout: float) -> None:
    if not 0 < timeout <= MAX_CALL_TIMEOUT_S:  # the workers would refuse the call (65)
        raise ValueError(f"timeout must be more than 0 and at most {MAX_CALL_TIMEOUT_S:g} seconds, got {timeout!r}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def checked_user(user: str) -> str:
    """A user name as a call may carry it (1 to 256 characters)."""
    if not isinstance(user, str) or not 0 < len(user) <= 256:
        raise ValueError("user must be a string of 1 to 256 characters")
    return user


def checked_tenant(tenant: str) -> str:
    """A tenant name as the workers accept it (else they would refuse the call with 65)."""
    if not re.fullmatch(TENANT_PATTERN, tenant):
        raise ValueError(f"tenant must match {TENANT_PATTERN}, got {tenant!r}")
    return tenant


def _message(spec: CallSpec, call_id: str, common: Mapping[str, Any]) -> dict[str, Any]:
    tool, arguments = spec[0], spec[1]
    headers: Mapping[str, str] = spec[2] if len(spec) > 2 else {}
    message: dict[str, Any] = {"callId": call_id, "tool": tool, "arguments": dict(arguments), **common}
    if headers:
        message["headers"] = dict(headers)
    return message


def _unanswered(call_id: str, tool: str, timeout: float) -> ToolResult:
    return ToolResult(
        call_id=call_id,
        tool=tool,
        exit_code=28,
        error={"type": "timeout", "message": f"The tool did not answer within {timeout:g} seconds."},
    )


async def _stored_on(link: _Link, call_ids: list[str]) -> list[dict[str, Any] | None]:
    return list(await asyncio.gather(*(stored_envelope(link.redis, call_id) for call_id in call_ids)))


async def stored_envelope(client: aioredis.Redis, call_id: str) -> dict[str, Any] | None:
    """The envelope published for a call, None while there is none (kept for the TTL)."""
    raw = await client.get(RESULT_KEY_PREFIX + call_id)
    return None if raw is None else envelope_from_meta(raw)


class CallHandle:
    """A submitted call; `.get(timeout)` waits for its envelope (and raises if it could not be enqueued)."""

    def __init__(self, client: ToolClient, call_id: str, sent: Future[list[str]]) -> None:
        self._client = client
        self._sent = sent
        self.call_id = call_id

    def get(self, timeout: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """Raises TimeoutError when the envelope does not come in time, RedisLost when Redis is gone."""
        started = time.monotonic()
        try:
            self._sent.result(timeout)
        except (FutureTimeout, RedisConnectionError, RedisTimeoutError) as exc:
            link = self._client._async.link_of_call(self.call_id)
            raise self._client._async.lost(f"while enqueuing call {self.call_id}", exc, timeout, link) from exc
        wait_s = max(0.0, started + timeout - time.monotonic())
        return self._client._run(self._client._async.result(self.call_id, wait_s), wait_s)


class ToolClient:
    """The synchronous client: the asyncio client on a background loop."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        shards: str | None = None,
        queue: str = DEFAULT_QUEUE,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        checked_tenant(tenant)
        if shards is not None:
            Shards.parse(shards)  # raised here, not on the loop
        self._loop = LoopThread("toolclient-loop")
        self._async = self._run(_make_async(redis_url, shards, queue, tenant), 30)

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> ToolResult:
        call = self._async.acall(
            tool, arguments, headers=headers, timeout=timeout, tenant=tenant, user=user, callback_url=callback_url
        )
        return self._run(call, timeout)

    def submit(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> CallHandle:
        # Returns at once, so that calls submitted in a row leave together in batch messages.
        if callback_url is not None:  # raised here, as the asynchronous client raises it from submit_many
            check_callback(EgressPolicy.parse(get_settings().callback_allow), callback_url)
        call_id = str(uuid.uuid4())
        spec = (tool, arguments or {}, headers or {})
        submit = self._async.submit_many(
            [spec], timeout=timeout, call_ids=[call_id], tenant=tenant, user=user, callback_url=callback_url
        )
        sent = asyncio.run_coroutine_threadsafe(submit, self._loop.loop)
        return CallHandle(self, call_id, sent)

    def call_many(
        self,
        calls: Iterable[CallSpec],
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> list[ToolResult]:
        many = self._async.acall_many(list(calls), timeout=timeout, tenant=tenant, user=user, callback_url=callback_url)
        return self._run(many, timeout)

    def tools(self, tags: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return self._run(self._async.tools(tags), DEFAULT_CALL_TIMEOUT_S)

    def schema(self, names: Sequence[str]) -> dict[str, Any]:
        return self._run(self._async.schema(names), DEFAULT_CALL_TIMEOUT_S)

    def search(self, question: str, top_k: int = 5) -> list[dict[str, Any]]:
        return self._run(self._async.search(question, top_k), DEFAULT_CALL_TIMEOUT_S)

    def close(self) -> None:
        self._loop.stop(self._async.aclose())

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return self._loop.run(coro, timeout + CLIENT_SLACK_S + _SYNC_GUARD_S)


async def _make_async(redis_url: str | None, shards: str | None, queue: str, tenant: str) -> AsyncToolClient:
    return AsyncToolClient(redis_url, shards=shards, queue=queue, tenant=tenant)
