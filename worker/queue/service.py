"""What a worker process runs for each message: parse, skip what is done, execute, publish."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Awaitable, Coroutine, Mapping
from concurrent.futures import Future
from typing import Any

import redis
import structlog
from redis.exceptions import RedisError

from worker import errors
from worker.call.catalog_tools import with_builtins
from worker.call.run import Runtime, ToolCall, execute, parse_call
from worker.constants import DEFINITIONS_BUNDLE_PREFIX, DEFINITIONS_CURRENT_KEY, TASK_EXECUTE
from worker.definitions import store
from worker.definitions.model import ToolSet
from worker.envelope import ToolResult
from worker.http.egress import EgressPolicy
from worker.http.transport import Transport
from worker.loop import process_loop
from worker.queue.publisher import Publisher, connect
from worker.settings import Settings, get_settings

log = structlog.get_logger("toolworker.service")
# Collector thresholds once the start-up heap is frozen: young collections stay small (a few ms), and a
# full one waits for 100 middle ones instead of 10.
GC_THRESHOLDS = (2000, 10, 100)


class Service:
    def __init__(self, runtime: Runtime, publisher: Publisher) -> None:
        self.runtime = runtime
        self.publisher = publisher
        self.definitions_version = 0
        self.watcher: Future[None] | None = None

    async def serve(
        self, messages: list[Any], task_id: str, batch: bool, redelivered: bool = True
    ) -> list[dict[str, Any]]:
        """Answer every message with exactly one published envelope; return short summaries.

        A message the broker delivers again (its first worker was lost, or the connection was) may hold
        calls already answered: those are skipped. A first delivery needs no such check, and publication
        stays once per callId either way."""
        received_at = time.time()
        parsed = [_parse(message, task_id, i if batch else None) for i, message in enumerate(messages)]
        done = await self.publisher.already_done([p.call_id for p in parsed]) if redelivered else set()
        if done:
            log.info("call.already_answered", callIds=sorted(done))
        pending = [p for p in parsed if p.call_id not in done]
        return list(await asyncio.gather(*(self._answer(p, received_at) for p in pending)))

    async def _answer(self, item: ToolCall | ToolResult, received_at: float) -> dict[str, Any]:
        if isinstance(item, ToolResult):  # the message itself was invalid
            result, reply_to = item, None
        else:
            result, reply_to = await execute(item, self.runtime, received_at), item.reply_to
        await self.publisher.publish_one(result, reply_to)
        return {"callId": result.call_id, "exitCode": result.exit_code, "statusCode": result.status_code}


def _parse(message: Any, task_id: str, index: int | None) -> ToolCall | ToolResult:
    """A call, or a ready failure envelope when the message cannot be a call."""
    default_id = task_id if index is None else f"{task_id}:{index}"
    try:
        return parse_call(message, default_id)
    except errors.ToolError as exc:
        call_id, tool = default_id, "?"
        if isinstance(message, dict):
            call_id = str(message.get("callId") or default_id)[:256]
            tool = str(message.get("tool") or "?")[:256]
        log.warning("call.invalid_message", callId=call_id, reason=exc.message)
        return ToolResult.failure(call_id, tool, exc)


def build_service(settings: Settings) -> Service:
    policy = EgressPolicy.parse(settings.egress_allow)
    version, toolset = _initial_definitions(settings)
    runtime = Runtime(
        toolset=with_builtins(toolset, policy),
        environ=dict(os.environ),
        transport=Transport(policy, settings.dns_server_list),
        policy=policy,
    )
    publisher = Publisher(connect(settings.redis_url), settings.result_ttl_seconds, settings.reply_stream_maxlen)
    runtime.redis = publisher.client
    service = Service(runtime, publisher)
    service.definitions_version = version
    if settings.store == "redis":
        service.watcher = asyncio.run_coroutine_threadsafe(
            _watch_definitions(service, settings, policy), process_loop().loop
        )
    return service


def _initial_definitions(settings: Settings) -> tuple[int, ToolSet]:
    client = redis.Redis.from_url(settings.redis_url)
    if settings.store == "file":
        toolset = _loaded(store.load([settings.definitions]), "file")
        try:
            store.write_routes(client, toolset)
        finally:
            client.close()
        return 0, toolset
    try:
        payload = client.get(DEFINITIONS_BUNDLE_PREFIX + str(int(client.get(DEFINITIONS_CURRENT_KEY) or 0)))
    finally:
        client.close()
    if payload is None:
        log.warning("definitions.none_published", hint="run `toolworker publish`")
        return 0, ToolSet()
    version, toolset = store.load_bundle(payload)
    return version, _loaded(toolset, f"redis v{version}")


def _loaded(toolset: ToolSet, origin: str) -> ToolSet:
    for problem in toolset.problems:
        log.warning("definitions.problem", problem=str(problem))
    log.info("definitions.loaded", source=origin, tools=len(toolset.tools), unusable=len(toolset.unusable))
    return toolset


async def _watch_definitions(service: Service, settings: Settings, policy: EgressPolicy) -> None:
    """Switch to each newly published version without a restart (polling survives reconnects)."""
    client = service.publisher.client
    while True:
        await asyncio.sleep(settings.store_poll_seconds)
        try:
            current = int(await client.get(DEFINITIONS_CURRENT_KEY) or 0)
            if current == service.definitions_version or current == 0:
                continue
            payload = await client.get(DEFINITIONS_BUNDLE_PREFIX + str(current))
        except RedisError as exc:
            log.warning("definitions.poll_failed", error=str(exc))
            continue
        if payload is not None:
            version, toolset = await asyncio.to_thread(store.load_bundle, payload)
            service.runtime.swap(with_builtins(_loaded(toolset, f"redis v{version}"), policy))
            service.definitions_version = version


_service: tuple[int, Service] | None = None
_lock = threading.Lock()


def process_service() -> Service:
    """The service of this process, built on first use (and again in a forked child)."""
    global _service
    with _lock:
        if _service is None or _service[0] != os.getpid():
            _service = (os.getpid(), build_service(get_settings()))
        return _service[1]


def settle_heap() -> None:
    """Keep the garbage collector off what lives for the whole process, once the worker has started.

    Celery, pydantic and the definitions are hundreds of thousands of objects that never become garbage,
    and calls in flight are many more that live for a while. With Python's defaults a burst of calls
    set off full collections over all of them: 50-300 ms each, with the event loop stopped (2.7 s of
    pauses in three bursts of 5,000 calls at a 100 ms upstream). Frozen, the start-up heap is no longer
    scanned, and the thresholds keep full collections rare."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve_task(
    task: str, task_id: str, payload: Any, delivery_info: Mapping[str, Any] | None
) -> Coroutine[Any, Any, Any]:
    """The work of one task message, ending with the task's result: `execute` carries a call (its
    summary), `execute_batch` a list of them (theirs). kombu marks every message it delivers again
    (restored after a lost worker or connection) `redelivered`."""
    service = process_service()  # built at worker start; never on the loop
    redelivered = bool((delivery_info or {}).get("redelivered", True))
    if task == TASK_EXECUTE:
        return _first(service.serve([payload], task_id, batch=False, redelivered=redelivered))
    calls = payload if isinstance(payload, list) else [payload]
    return service.serve(calls, task_id, batch=True, redelivered=redelivered)


async def _first(summaries: Awaitable[list[dict[str, Any]]]) -> dict[str, Any] | None:
    done = await summaries
    return done[0] if done else None


def run_task(task: str, task_id: str, payload: Any, delivery_info: Mapping[str, Any] | None) -> Any:
    """Bridge from a Celery pool thread to the process loop."""
    work = serve_task(task, task_id, payload, delivery_info)
    return process_loop().run(work, get_settings().visibility_timeout_seconds)
