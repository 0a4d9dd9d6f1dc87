"""What a worker process does with each message: parse, skip what is done, run, publish.

Built once per process with everything it depends on (the call runtime, the publisher, Redis) passed
in; with the shared store it also follows the published definitions versions.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Literal

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from worker import errors, metrics, tracing
from worker.call.connect import ConnectLinks
from worker.call.delegated import UserTokens
from worker.call.run import run_call
from worker.call.runtime import Runtime
from worker.call.vault import Keyring
from worker.connections import connect, sync_client
from worker.constants import DEFAULT_QUEUE, PROGRAM_TOOL
from worker.definitions import file_store, listings, redis_store
from worker.definitions.builtin import served_toolset
from worker.definitions.mcp_tools import Listing, with_listings
from worker.definitions.model import ToolSet
from worker.envelope import ToolResult
from worker.errors import CallbackRefused
from worker.http.egress import EgressPolicy, check_callback
from worker.http.transport import HttpTransport
from worker.program.runs import CHILD_MARK
from worker.program.sandbox import Limits, Sandbox
from worker.protocol import ToolCall, parse_call, reply_stream
from worker.queue import activity
from worker.queue.approvals import PARKED_NOW, Gate
from worker.queue.outcome import PublishFailed
from worker.queue.programs import Programs
from worker.queue.publisher import Publisher
from worker.queue.webhooks import Deliveries
from worker.settings import Settings, get_settings

log = structlog.get_logger("toolworker.service")


class Service:
    def __init__(
        self,
        runtime: Runtime,
        publisher: Publisher,
        definitions_version: int = 0,
        gate: Gate | None = None,
        deliveries: Deliveries | None = None,
        programs: Programs | None = None,
    ) -> None:
        self.runtime = runtime
        self.publisher = publisher
        self.definitions_version = definitions_version
        # Calls that wait for a human's approval are parked here instead of run (approvals.py).
        self.gate = gate
        # The webhooks of this process (worker/queue/webhooks.py); None: callbacks are refused.
        self.deliveries = deliveries
        # Code mode's programs, parked while their calls run (programs.py).
        self.programs = programs
        # The definitions as published, and the MCP upstreams' listings served with them.
        self.defined = ToolSet() if runtime is None else runtime.toolset
        self.listings: dict[str, Listing] = {}

    async def serve(
        self, messages: list[Any], task_id: str, batch: bool, redelivered: bool = True, over_quota: int | None = None
    ) -> list[dict[str, Any]]:
        """Answer every message with exactly one published envelope; return short summaries.

        A message the broker delivers again (its first worker was lost, or the connection was) may hold
        calls already answered: those are skipped. A first delivery needs no such check, and publication
        stays once per callId either way. A message taken while its tenant was over its max_queued
        (`over_quota`) has its calls refused (exit 75), not run."""
        received_at = time.time()
        parsed = [_parse(message, task_id, i if batch else None) for i, message in enumerate(messages)]
        done = await self._already_done([p[0].call_id for p in parsed]) if redelivered else set()
        if done:
            log.info("call.already_answered", callIds=sorted(done))
            await self._woken(done)
        pending = [(self._checked(p[0], over_quota), p[1]) for p in parsed if p[0].call_id not in done]
        if len(pending) == 1:  # most messages: answered in this task, without a task of its own
            return [await self._answer(*pending[0], received_at)]
        # Every call of the message runs to its end before a failure hands the message back.
        outcomes = await asyncio.gather(
            *(self._answer(item, reply_to, received_at) for item, reply_to in pending), return_exceptions=True
        )
        summaries = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
        if len(summaries) < len(outcomes):
            raise next(outcome for outcome in outcomes if isinstance(outcome, BaseException))
        return summaries

    async def _already_done(self, call_ids: list[str]) -> set[str]:
        try:
            return await self.publisher.already_done(call_ids)
        except Exception as exc:  # unknown whether they were answered: the message goes back, not done
            log.error("call.done_check_failed", callIds=call_ids, reason=_reason(exc))
            raise PublishFailed("Could not check whether the calls were answered already.") from exc

    async def _held(self, gate: Gate, call: ToolCall, received_at: float) -> ToolResult | Literal["parked"] | None:
        try:
            return await gate.hold(call, received_at)
        except Exception as exc:  # unknown whether it may run: the message goes back, not done
            log.error("call.approval_check_failed", callId=call.call_id, reason=_reason(exc))
            raise PublishFailed(f"Could not check whether call {call.call_id} needs approval.") from exc

    def _checked(self, item: ToolCall | ToolResult, over_quota: int | None) -> ToolCall | ToolResult:
        """The call, or its refusal: its tenant over its max_queued, or a callback this worker may not call."""
        item = _refused(item, over_quota)
        if isinstance(item, ToolResult) or item.callback is None:
            return item
        try:
            if self.deliveries is None:
                raise CallbackRefused("Callbacks are off: TOOLWORKER_CALLBACK_SECRET (and _ALLOW) must be set.")
            check_callback(self.deliveries.policy, item.callback.url)
        except CallbackRefused as exc:
            log.warning("call.callback_refused", callId=item.call_id, reason=exc.message)
            return ToolResult.failure(item.call_id, item.tool, exc)
        return item

    async def _publish(self, result: ToolResult, reply_to: str | None, callback_url: str | None = None) -> None:
        """Publish the envelope; a failure is logged and raised as PublishFailed, so that the message is
        handed back rather than acknowledged with its call unanswered."""
        try:
            await self.publisher.publish_one(result, reply_to, callback_url)
        except Exception as exc:
            log.error("call.publish_failed", callId=result.call_id, tool=result.tool, reason=_reason(exc))
            raise PublishFailed(f"The result of call {result.call_id} could not be published.") from exc

    async def _answer(self, item: ToolCall | ToolResult, reply_to: str | None, received_at: float) -> dict[str, Any]:
        if isinstance(item, ToolCall) and self.programs is not None and item.tool == PROGRAM_TOOL:
            ran = await self.programs.serve(item)
            if ran == PARKED_NOW:  # its tool calls run; their answers put it back on the queue
                return {"callId": item.call_id, "tool": item.tool, "exitCode": None, "parked": True}
            item = ran
        if isinstance(item, ToolCall) and self.gate is not None:
            held = await self._held(self.gate, item, received_at)
            if held == PARKED_NOW:  # no envelope until a human decides; the message is done with
                return {"callId": item.call_id, "tool": item.tool, "exitCode": None, "parked": True}
            item = item if held is None else held  # held: the envelope of a call refused
        if isinstance(item, ToolResult):  # not a call, or one refused before it could run
            result = item
            await self._publish(result, reply_to)
        else:
            result = await self._traced(item, reply_to, received_at)
        await self._woken({result.call_id})
        summary = {"callId": result.call_id, "tool": result.tool, "exitCode": result.exit_code}
        summary["statusCode"] = result.status_code
        if result.error is not None:  # what Flower shows of a failed call (written for the model: no secret)
            summary["error"] = result.error
        return summary

    async def _traced(self, call: ToolCall, reply_to: str | None, received_at: float) -> ToolResult:
        context = {"traceparent": call.traceparent, "tracestate": call.tracestate}
        upstream = self.runtime.upstream_of(call.tool)
        tool = call.tool if upstream is not None else metrics.UNRESOLVED_TOOL  # the model's text is no name
        with tracing.serving(tool, call.call_id, context, call.enqueued_at, received_at, call.tenant) as span:
            result = await run_call(call, self.runtime, received_at)
            activity.observe(self._queue_of(upstream), call.tenant, result.exit_code == 0, result.duration_ms / 1000)
            error_type = None if result.error is None else str(result.error.get("type"))
            tracing.answered(span, upstream, result.exit_code, result.status_code, result.attempts, error_type)
            with tracing.publishing(tool):
                await self._publish(result, reply_to, call.callback.url if call.callback else None)
        return result

    async def _woken(self, call_ids: set[str]) -> None:
        """A program waiting for one of these calls may go on (programs.py)."""
        if self.programs is None:
            return
        for call_id in call_ids:
            if CHILD_MARK in call_id:
                await self.programs.answered(call_id)

    def _queue_of(self, upstream: str | None) -> str:
        found = self.runtime.toolset.upstreams.get(upstream) if upstream is not None else None
        return found.queue if found is not None and found.queue else DEFAULT_QUEUE

    async def switch(self, version: int, toolset: ToolSet) -> None:
        """Serve a newly published definitions version from the next call on."""
        self.defined = _loaded(toolset, f"redis v{version}")
        self._serve()
        self.definitions_version = version
        await asyncio.to_thread(_share_tenants, get_settings(), toolset)

    def relist(self, found: dict[str, Listing]) -> None:
        """Serve the MCP upstreams' newly stored listings from the next call on."""
        self.listings = found
        self._serve()

    def _serve(self) -> None:
        served = with_listings(self.defined, self.listings)
        self.runtime.swap(served_toolset(served, self.runtime.policy.enabled))

    async def close(self) -> None:
        if self.deliveries is not None:
            await self.deliveries.close()
        if self.programs is not None:
            await self.programs.sandbox.close()
        await self.runtime.close()
        await self.publisher.client.aclose()
        home = self.runtime.redis
        if home is not None and home is not self.publisher.client:  # sharded: the home shard's client
            await home.aclose()


def _reason(exc: Exception) -> str:
    """What went wrong, for the log: the error's type and the start of its text (Redis errors name no value)."""
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _refused(item: ToolCall | ToolResult, over_quota: int | None) -> ToolCall | ToolResult:
    """The call, or its refusal when its tenant was over its max_queued as the message was taken."""
    if over_quota is None or isinstance(item, ToolResult):
        return item
    log.warning("call.over_quota", callId=item.call_id, tenant=item.tenant, maxQueued=over_quota)
    return ToolResult.failure(item.call_id, item.tool, errors.TenantQueueFull(item.tenant, over_quota))


def _parse(message: Any, task_id: str, index: int | None) -> tuple[ToolCall | ToolResult, str | None]:
    """A call and its reply stream, or a ready failure envelope when the message cannot be a call (still
    sent to the stream it names, so that a producer waiting there hears of it)."""
    default_id = task_id if index is None else f"{task_id}:{index}"
    try:
        call = parse_call(message, default_id)
    except errors.ToolError as exc:
        call_id, tool = default_id, "?"
        if isinstance(message, dict):
            call_id = str(message.get("callId") or default_id)[:256]
            tool = str(message.get("tool") or "?")[:256]
        log.warning("call.invalid_message", callId=call_id, reason=exc.message)
        return ToolResult.failure(call_id, tool, exc), reply_stream(message)
    return call, call.reply_to


def user_tokens(settings: Settings, client: aioredis.Redis) -> UserTokens:
    """The vault as the worker reads it (its connect links point at the gateway's public URL)."""
    keyring = Keyring.parse(settings.vault_keys.get_secret_value())
    links = ConnectLinks(client, keyring, settings.public_url, settings.connect_ttl_seconds) if keyring else None
    return UserTokens(client, keyring, links, settings.audit_stream_maxlen)


def build_service(settings: Settings, bundles: redis_store.Bundles | None = None) -> Service:
    """The service of a worker process, its definitions loaded (and, for the file store, its routes and
    files announced)."""
    tracing.configure("toolworker")
    policy = EgressPolicy.parse(settings.egress_allow)
    version, toolset = _initial_definitions(settings, bundles)
    # Upstream-wide state (rate limits, circuits, tokens, the vault, the cache) is on the home shard; the
    # calls taken here are answered, parked and called back on the shard they came from (worker/shards.py).
    home = connect(settings.redis_url)
    queue = home if settings.queue_url == settings.redis_url else connect(settings.queue_url)
    found = _listings(settings)
    runtime = Runtime(
        toolset=served_toolset(with_listings(toolset, found), policy.enabled),
        environ=dict(os.environ),
        transport=HttpTransport(policy, settings.dns_server_list),
        policy=policy,
        redis=home,
        users=user_tokens(settings, home),
        queue=queue,
    )
    deliveries = _deliveries(settings, queue)
    wake = deliveries.wake if deliveries is not None else None
    publisher = Publisher(queue, settings.result_ttl_seconds, settings.reply_stream_maxlen, wake)
    gate = Gate(queue, runtime, settings.approval_ttl_seconds, settings.result_ttl_seconds)
    service = Service(runtime, publisher, version, gate, deliveries, _programs(settings, queue, runtime, publisher))
    service.defined, service.listings = toolset, found
    return service


def _programs(settings: Settings, client: aioredis.Redis, runtime: Runtime, publisher: Publisher) -> Programs:
    """Code mode's programs of this process (the sandbox's processes start with the first program)."""
    limits = Limits(
        settings.code_max_calls, settings.code_max_memory_mb, settings.code_cpu_seconds, settings.code_max_output_bytes
    )
    sandbox = Sandbox(limits, settings.code_sandboxes)
    return Programs(client, runtime, sandbox, publisher, settings.code_timeout_seconds, settings.result_ttl_seconds)


def _listings(settings: Settings) -> dict[str, Listing]:
    """The MCP upstreams' listings stored so far."""
    client = sync_client(settings.redis_url)
    try:
        return listings.read(client)
    finally:
        client.close()


def _deliveries(settings: Settings, client: aioredis.Redis) -> Deliveries | None:
    """The webhook deliveries of this process; None when callbacks are off (no allow-list or no secret)."""
    policy = EgressPolicy.parse(settings.callback_allow)
    keys = settings.callback_keys
    if not policy.enabled or not keys:
        return None
    retry_s, timeout_s = settings.callback_retry_seconds, settings.callback_timeout_seconds
    return Deliveries(client, policy, keys, retry_s, timeout_s, settings.dns_server_list)


def _initial_definitions(settings: Settings, bundles: redis_store.Bundles | None) -> tuple[int, ToolSet]:
    client = sync_client(settings.redis_url)
    try:
        if settings.store == "file":
            toolset = _loaded(file_store.load([settings.definitions]), "file")
            redis_store.announce(client, [settings.definitions], toolset)  # routes for clients, files for gateways
            redis_store.write_tenants(client, toolset)
            _share_tenants(settings, toolset)
            return 0, toolset
        payload = redis_store.current_payload(client)
    finally:
        client.close()
    if payload is None:
        log.warning("definitions.none_published", hint="run `toolworker publish`")
        return 0, ToolSet()
    version, toolset = (bundles or redis_store.Bundles()).load(payload)
    _share_tenants(settings, toolset)
    return version, _loaded(toolset, f"redis v{version}")


def _share_tenants(settings: Settings, toolset: ToolSet) -> None:
    """A shard other than the home one gets the tenants' limits too: its takes and enqueues read them there.
    A shard that is down gets them once it is back (tried every second meanwhile; the process waits for
    its shard anyway)."""
    if settings.queue_url == settings.redis_url:
        return

    def write() -> bool:
        client = sync_client(settings.queue_url, socket_connect_timeout=2.0, socket_timeout=2.0)
        try:
            redis_store.write_tenants(client, toolset)
            return True
        except RedisError as exc:
            log.warning("definitions.tenants_not_shared", shard=settings.shard, reason=_reason(exc))
            return False
        finally:
            client.close()

    def until_written() -> None:
        while not write():
            time.sleep(1.0)

    if not write():
        threading.Thread(target=until_written, name="toolworker-share-tenants", daemon=True).start()


def _loaded(toolset: ToolSet, origin: str) -> ToolSet:
    for problem in toolset.problems:
        log.warning("definitions.problem", problem=str(problem))
    log.info("definitions.loaded", source=origin, tools=len(toolset.tools), unusable=len(toolset.unusable))
    return toolset
