"""AsyncToolClient: enqueue tool calls and await their envelopes on redis.asyncio.

Calls are LPUSHed as Celery protocol 2 messages (outbox.py) on their tenant's shard (routing.py), and
answered on the client's reply stream (replies.py). A call's timeout bounds the caller's wait: past it,
the result store is read once, within CLIENT_SLACK_S; a Redis that does not answer by then raises
RedisLost (a Redis back in time is used).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis

from worker.client.messages import CallSpec, check_timeout, checked_tenant, common_fields, message
from worker.client.outbox import Outbox
from worker.client.replies import Replies
from worker.client.routing import Link, Routing
from worker.constants import CODE_CALL_TIMEOUT_S, DEFAULT_CALL_TIMEOUT_S, DEFAULT_QUEUE, DEFAULT_TENANT, PROGRAM_TOOL
from worker.envelope import ToolResult
from worker.errors import RedisLost, TenantQueueFull
from worker.http.egress import EgressPolicy, check_callback
from worker.sealing import Keyring
from worker.settings import get_settings
from worker.shards import Shards


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
        self.tenant = checked_tenant(tenant)
        # Seals the calls' headers when TOOLWORKER_VAULT_KEYS is set (the workers hold the same keys).
        self.keyring = Keyring.parse(get_settings().vault_keys.get_secret_value())
        self.routing = Routing(self.shards)
        self.replies = Replies(self.routing)
        self.outbox = Outbox(self.routing.home, queue, max_batch, one_shard=len(self.routing.links) == 1)

    @property
    def reply_stream(self) -> str:
        return self.replies.stream

    async def __aenter__(self) -> AsyncToolClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.aclose()

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

    async def arun_code(
        self, code: str, *, timeout: float = CODE_CALL_TIMEOUT_S, tenant: str | None = None, user: str | None = None
    ) -> ToolResult:
        """Run a program (code mode, docs/guides/code-mode.md): its value is the envelope's `result`
        (`structuredContent` when not text), its printed text `output`, its tool calls `calls`."""
        return await self.acall(PROGRAM_TOOL, {"code": code}, timeout=timeout, tenant=tenant, user=user)

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
        check_timeout(timeout)  # before it bounds anything
        started = time.monotonic()
        link = self._link_of(tenant)
        enqueue = self.submit_many(calls, timeout=timeout, tenant=tenant, user=user, callback_url=callback_url)
        doing = "while enqueuing the call (it may be enqueued all the same)"
        call_ids = await self.routing.bounded(enqueue, timeout, doing, link)
        wait_s = max(0.0, started + timeout - time.monotonic())
        return await self.replies.collect(call_ids, [spec[0] for spec in calls], wait_s, timeout)

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
        relay: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """Enqueue calls and return their callIds; each call's envelope can be awaited on its own. The
        calls carry the active span's trace context (OpenTelemetry), else `trace` when given; they are
        for `tenant` (the client's own when None), made by `principal` when one is named (the gateway).
        With `callback_url`, each envelope is also POSTed there once published (signed webhooks); raises
        CallbackRefused (an EgressBlocked) when TOOLWORKER_CALLBACK_ALLOW does not allow it. `relay`: what
        an MCP upstream sends during a call that the submitter listens for (protocol.Relay).
        Raises TenantQueueFull, enqueuing none of them, when the tenant has its max_queued calls waiting."""
        check_timeout(timeout)
        if callback_url is not None:
            check_callback(EgressPolicy.parse(get_settings().callback_allow), callback_url)
        tenant = self.tenant if tenant is None else checked_tenant(tenant)
        link = self._link_of(tenant)
        common = common_fields(timeout, self.replies.stream, trace, tenant, principal, user, callback_url, relay)
        ids = call_ids or [str(uuid.uuid4()) for _ in calls]
        messages = [message(spec, call_id, common, self.keyring) for spec, call_id in zip(calls, ids, strict=True)]
        self.replies.expect(ids, link)
        try:
            refused = await self.outbox.send(link, messages)
            if tenant in refused:
                raise TenantQueueFull(tenant, refused[tenant])
        except BaseException:  # not enqueued (or the caller gave up): nothing will answer these
            self.replies.forget(ids)
            raise
        return list(ids)

    async def result(self, call_id: str, timeout: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """The envelope of a call; raises TimeoutError when it does not come in time (RedisLost when Redis
        does not answer either). A call submitted by another client is looked for on every shard."""
        return await self.replies.result(call_id, timeout)

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

    def redis_of(self, tenant: str) -> aioredis.Redis:
        """The client of a tenant's shard (its parked calls, its results)."""
        return self.routing.link_of(tenant).redis

    def shard_clients(self) -> list[aioredis.Redis]:
        """A client on each shard, the home one first."""
        return [link.redis for link in self.routing.links.values()]

    def link_of_call(self, call_id: str) -> Link | None:
        return self.routing.sent_to.get(call_id)

    def lost(self, doing: str, exc: BaseException, timeout_s: float, link: Link | None = None) -> RedisLost:
        """The error for a step that Redis did not let finish, naming the shard it was waiting for."""
        return self.routing.lost(doing, exc, timeout_s, link)

    async def aclose(self) -> None:
        await self.outbox.drain(self.routing.links.values())
        await self.replies.close()
        await self.routing.close()

    def _link_of(self, tenant: str | None) -> Link:
        return self.routing.link_of(self.tenant if tenant is None else tenant)
