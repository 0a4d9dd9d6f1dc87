"""Calls through the queue, as every front end of the gateway makes them.

A call is enqueued with the project's own `AsyncToolClient` and answered from its envelope; the gateway
never speaks HTTP to an upstream. A callId the client chose is claimed in Redis (claims.py: `SET NX`,
with a fingerprint of the tool and arguments) before the call is enqueued, so that a client sending the
same callId again - after a lost response, or to another gateway process after this one died - is
answered from the first call (its stored envelope) instead of running it twice; the same callId with
other arguments, or from another principal, is a conflict. A callId the gateway made up cannot come
twice, but it is claimed all the same: the claim names the principal that made the call, the only one
(besides those with the `operate` grant) that may read it or withdraw it.

A call of a cached tool whose answer is in the cache (worker/call/cache.py, the same key the workers
store under) is answered here, without the queue: no claim, no message, no worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from worker import tracing
from worker.call import cache
from worker.call.arguments import ArgumentSchema
from worker.client import AsyncToolClient
from worker.connections import async_client
from worker.constants import KIND_PROGRAM, PROGRAM_TOOL
from worker.definitions.model import Tool, needs_approval
from worker.envelope import ToolResult
from worker.errors import ToolError, UnknownTool
from worker.gateway import metrics
from worker.gateway.catalog import Catalog, Snapshot
from worker.gateway.claims import Claim, Claims
from worker.gateway.decisions import Decisions
from worker.gateway.headers import forwarded
from worker.gateway.health import FleetHealth
from worker.gateway.identity.audit import AuditTrail, Decision, Record, now_iso
from worker.gateway.identity.delegation import Delegation, open_delegation
from worker.gateway.identity.principals import LOCAL, Principal
from worker.gateway.withdraw import withdraw
from worker.mcp_client import task_records
from worker.queue import approvals, programs
from worker.queue.publisher import Publisher
from worker.settings import Settings

log = structlog.get_logger("toolworker.gateway.calls")
MAX_CALL_ID_CHARS = 256
# What a client refused for its tenant's max_queued is told to wait before it tries again (Retry-After).
QUEUE_FULL_RETRY_AFTER_S = 5


class CallIdConflict(ValueError):
    """A callId already names a call with another tool or other arguments."""


@dataclass(frozen=True)
class CallSpec:
    """One call as a front end asks for it; `headers` are the client's own, filtered on submission."""

    tool: str
    arguments: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)
    call_id: str | None = None
    timeout_s: float = 60.0
    # The caller's W3C trace context (MCP `_meta`); else the HTTP `traceparent` header is looked for.
    trace: Mapping[str, str] = field(default_factory=dict)
    # Who asks: its name and tenant go with the call; its grant decides which tools it may call.
    principal: Principal = LOCAL
    # A tool that needs approval: who approved the call before it was enqueued (asked through MCP).
    approved_by: str | None = None
    # The caller's validated OAuth access token, for an `oauth2_token_exchange` upstream (never enqueued).
    subject_token: str | None = field(default=None, repr=False)
    # Where the envelope is POSTed once published (worker/queue/webhooks.py).
    callback: str | None = None
    # What an MCP caller listens for while an MCP upstream answers (protocol.Relay's fields).
    relay: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Submitted:
    call_id: str
    tool: Tool
    # False when the callId was known: the call was not enqueued again.
    enqueued: bool
    principal: Principal = LOCAL
    taken_at: str = ""
    started_s: float = 0.0
    # Answered from the cache: nothing was enqueued.
    envelope: ToolResult | None = None


class Calls:
    def __init__(
        self,
        client: AsyncToolClient,
        redis: aioredis.Redis,
        catalog: Catalog,
        health: FleetHealth,
        claim_ttl_s: int,
        audit: AuditTrail | None = None,
        delegation: Delegation | None = None,
        stream_maxlen: int = 100_000,
    ) -> None:
        self.client = client
        self.catalog = catalog
        self.health = health
        self._redis = redis
        self._claims = Claims(redis, claim_ttl_s)
        self._keep_s = claim_ttl_s
        self.audit = audit
        # Parked calls: what waits for a human, and their decisions (any gateway process decides on any).
        shards = client.shard_clients() if client.shards.sharded else [redis]
        self.decisions = Decisions(shards, lambda shard: Publisher(shard, claim_ttl_s, stream_maxlen), audit)
        self.delegation = delegation

    @property
    def redis(self) -> aioredis.Redis:
        """The gateway's Redis client (for the rooms that keep state of their own: MCP tasks)."""
        return self._redis

    def visible(self, principal: Principal) -> Snapshot:
        """The catalog as `principal` sees it: the tools its grant allows, nothing else."""
        return self.catalog.snapshot.scoped(principal.grant)

    def resolve(self, name: str, principal: Principal = LOCAL) -> Tool:
        """The tool of this name, if `principal` may call it; a tool outside its grant is as unknown as one
        that does not exist."""
        tool = self.visible(principal).tool(name)
        if tool is None:
            raise UnknownTool(name)
        return tool

    def needs_approval(self, tool: Tool) -> bool:
        """Whether calls of this tool wait for a human's approval (its rule, else its upstream's)."""
        return needs_approval(tool, self.catalog.snapshot.upstream(tool))

    async def submit(self, spec: CallSpec) -> Submitted:
        """Enqueue a call (or find the one its callId names); raises UnknownTool, CallIdConflict,
        FleetUnavailable, TenantQueueFull (the tenant's max_queued), CallbackRefused."""
        tool = self.resolve(spec.tool, spec.principal)
        call_id = spec.call_id or str(uuid.uuid4())
        hit = await self._cached(tool, spec, call_id)
        if hit is not None:
            submitted = Submitted(call_id, tool, False, spec.principal, now_iso(), time.perf_counter(), hit)
            self._record(submitted, hit.exit_code)
            return submitted
        await self.health.admit()
        upstream = self.catalog.snapshot.upstream(tool)
        exchanging = upstream.auth is not None and upstream.auth.type == "oauth2_token_exchange"
        delegation = self.delegation if exchanging else None
        # A callId the gateway made up cannot be taken: its claim is written while the call is enqueued (one
        # round trip fewer before the call reaches a worker). A client's must be checked first.
        beside = spec.call_id is None and spec.approved_by is None and delegation is None
        claimed = asyncio.ensure_future(self._claim(call_id, spec)) if beside else None
        if claimed is None and not await self._claim(call_id, spec):
            return Submitted(call_id, tool, enqueued=False, principal=spec.principal)
        if spec.approved_by is not None:
            await self._grant(call_id, tool, spec)
        headers = forwarded(spec.headers, upstream)
        if delegation is not None:
            await delegation.exchange(spec.principal.name, upstream, spec.subject_token)
        call = (spec.tool, self._arguments(tool, spec), headers)
        trace = spec.trace or tracing.context_from(spec.headers)
        who = spec.principal
        taken_at, started_s = now_iso(), time.perf_counter()
        try:
            with tracing.producing(spec.tool, trace):
                await self.client.submit_many(
                    [call],
                    timeout=spec.timeout_s,
                    call_ids=[call_id],
                    trace=trace,
                    tenant=who.tenant,
                    principal=who.name,
                    user=who.name,
                    callback_url=spec.callback,
                    relay=spec.relay,
                )
        except BaseException:  # not enqueued: the same callId may be sent again
            if claimed is not None:
                await asyncio.gather(claimed, return_exceptions=True)
            await self._claims.release(call_id)
            raise
        if claimed is not None:
            try:
                await claimed
            except RedisError as exc:  # enqueued all the same: it is answered, but cannot be looked up by callId
                log.warning("gateway.claim_not_written", callId=call_id, error=str(exc))
        return Submitted(call_id, tool, True, who, taken_at, started_s)

    def _arguments(self, tool: Tool, spec: CallSpec) -> dict[str, Any]:
        """The call's arguments; a program's name the tools its `tools` offers: what the principal may call."""
        arguments = dict(spec.arguments)
        if tool.kind == KIND_PROGRAM:
            arguments["tools"] = [name for name in self.visible(spec.principal).names if name != PROGRAM_TOOL]
        return arguments

    async def _grant(self, call_id: str, tool: Tool, spec: CallSpec) -> None:
        """Record the approval a human gave through MCP, so that the worker runs the call (once)."""
        who, by = spec.principal, str(spec.approved_by)
        upstream = self.catalog.snapshot.upstream(tool)
        fields = approvals.describe({"arguments": dict(spec.arguments)}, tool, upstream, who.tenant, who.name)
        fields.update(decidedBy=by, reason="approved when asked through MCP", decidedAt=repr(time.time()))
        await approvals.grant(self.client.redis_of(who.tenant), call_id, fields, self._keep_s)
        if self.audit is not None:
            self.audit.record(Decision(now_iso(), by, who.tenant, tool.name, call_id, "approve", fields["reason"]))

    async def _cached(self, tool: Tool, spec: CallSpec, call_id: str) -> ToolResult | None:
        """The call's answer from the cache, when its tool is cached and its arguments are valid."""
        upstream = self.catalog.snapshot.upstream(tool)
        headers = forwarded(spec.headers, upstream)
        lookup = cache.lookup(tool, upstream, spec.arguments, headers, self._redis, spec.principal.name)
        if lookup is None:
            return None
        try:
            _arguments_schema(tool).check(dict(spec.arguments))
        except ToolError:
            return None  # the worker says what is wrong with them
        hit = await lookup.get(call_id)
        metrics.observe_cache(tool.name, hit=hit is not None)
        return hit

    def hold(self, submitted: Submitted) -> None:
        """When a client is given a callId to come back with (its claim was made on submission): its audit
        record says `pending`."""
        self._record(submitted, None)

    async def wait(self, call_id: str, timeout_s: float) -> ToolResult | None:
        """The call's envelope, or None when it does not come within `timeout_s`."""
        try:
            return await self.client.result(call_id, timeout_s)
        except TimeoutError:
            return None

    async def answer(self, submitted: Submitted, timeout_s: float) -> ToolResult | None:
        """The envelope of a call just submitted; one that a worker just produced shows the fleet is up."""
        if submitted.envelope is not None:
            return submitted.envelope
        try:
            envelope = await self.wait(submitted.call_id, timeout_s)
        except BaseException:  # the client went away (MCP cancellation): the call was taken all the same
            self._record(submitted, None)
            raise
        if envelope is not None and submitted.enqueued:
            self.health.answered()
            self._record(submitted, envelope.exit_code)
        return envelope

    def _record(self, submitted: Submitted, exit_code: int | None) -> None:
        """The call's audit record, once: when its envelope comes, or when the client is told to come back."""
        if self.audit is None or not (submitted.enqueued or submitted.envelope is not None):
            return
        who, waited_ms = submitted.principal, round((time.perf_counter() - submitted.started_s) * 1000, 3)
        record = Record(
            submitted.taken_at, who.name, who.tenant, submitted.tool.name, submitted.call_id, exit_code, waited_ms
        )
        self.audit.record(record)

    async def tool_of(self, call_id: str, principal: Principal = LOCAL) -> str | None:
        """The tool of a call the gateway enqueued (within the result TTL) that `principal` made (or operates)
        and may see, else None: another principal's call is as unknown as one that never was."""
        claim = await self._claims.get(call_id)
        if claim is None or self.visible(principal).tool(claim.tool) is None:
            return None
        mine = secrets.compare_digest(claim.owner.encode(), principal.name.encode())
        return claim.tool if mine or principal.grant.may("operate") else None

    async def made_by(self, call_id: str, tool: str, arguments: Mapping[str, Any], principal: Principal) -> bool:
        """Whether `principal` made this call, of this tool with these arguments (within the result TTL)."""
        claim = await self._claims.get(call_id)
        if claim is None or claim.tool != tool or claim.fingerprint != fingerprint(tool, arguments):
            return False
        return secrets.compare_digest(claim.owner.encode(), principal.name.encode())

    async def withdraw(self, call_id: str, tool: str, tenant: str) -> bool:
        """Take a call that has not started off the queue (its tenant's list); its callId is free again
        afterwards."""
        if not await withdraw(self.client.redis_of(tenant), tool, call_id, tenant, routes=self._redis):
            return False
        await self._claims.release(call_id)
        return True

    async def cancel_program(self, call_id: str, tenant: str) -> bool:
        """Cancel a program waiting for its tool calls (code mode): answered 75 by a worker, its calls not
        started withdrawn; False when it is not a waiting program."""
        redis = self.client.redis_of(tenant)
        children = await programs.cancel(redis, call_id)
        if children is None:
            return False
        for child, tool in children.items():
            await withdraw(redis, tool, child, tenant, routes=self._redis)
        return True

    async def cancel_upstream_task(self, call_id: str) -> bool:
        """Cancel a running call that waits on a task of its MCP server: the worker polling it sends
        `tasks/cancel` and answers 75; False when the call waits on no upstream task."""
        return await task_records.mark_cancelled(self._redis, call_id)

    async def upstream_status(self, call_id: str) -> str | None:
        """The status message of the upstream task a running call waits on, if it has one."""
        return await task_records.status(self._redis, call_id)

    async def _claim(self, call_id: str, spec: CallSpec) -> bool:
        """True when this callId is new (and now claimed); raises CallIdConflict for another call's id."""
        claim = Claim(fingerprint(spec.tool, spec.arguments), spec.tool, spec.principal.name)
        existing = await self._claims.claim(call_id, claim)
        if existing is not None and existing != claim:
            raise CallIdConflict(f"The callId {call_id!r} already names a call with another tool or other arguments.")
        return existing is None


@asynccontextmanager
async def open_calls(settings: Settings, tags: Iterable[str] = ()) -> AsyncIterator[Calls]:
    """The gateway's calls on `settings.redis_url` (each tenant's on its shard), with its catalog loaded
    (and followed)."""
    tracing.configure("toolworker-gateway")
    client = AsyncToolClient()  # on TOOLWORKER_REDIS_SHARDS, else TOOLWORKER_REDIS_URL
    redis = async_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
    catalog = Catalog(settings, tags)
    audit = AuditTrail(redis, settings.audit_stream_maxlen)
    delegation = open_delegation(settings, redis)
    try:
        await catalog.start(redis)
        health = FleetHealth(settings.redis_url)
        yield Calls(
            client, redis, catalog, health, settings.result_ttl_seconds, audit, delegation, settings.reply_stream_maxlen
        )
    finally:
        await delegation.close()
        await audit.drain()
        await catalog.close()
        await client.aclose()
        await redis.aclose()


@lru_cache(maxsize=4096)
def _arguments_schema(tool: Tool) -> ArgumentSchema:
    return ArgumentSchema(tool.input_schema)


def fingerprint(tool: str, arguments: Mapping[str, Any]) -> str:
    """What makes two calls the same call (headers are left out: they hold secrets, and vary by session)."""
    text = json.dumps([tool, arguments], sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check_call_id(call_id: object) -> str | None:
    """A client-given callId, if usable (a non-empty string of at most 256 characters)."""
    if call_id is None:
        return None
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_CALL_ID_CHARS:
        raise ValueError(f"callId must be a string of 1 to {MAX_CALL_ID_CHARS} characters")
    return call_id
