"""From Celery to the process's event loop: the service of this process, and the work of one message.

Celery runs task code on its own threads (the consumer for our pool, pool threads otherwise); all the
calls of a process run on one long-lived loop (worker/loop.py), so connection pools are reused.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Coroutine, Mapping
from concurrent.futures import Future
from typing import Any

from celery.exceptions import Reject

from worker import tracing
from worker.constants import TASK_EXECUTE
from worker.definitions import redis_store
from worker.loop import process_loop
from worker.queue import approvals
from worker.queue.outcome import PublishFailed
from worker.queue.service import Service, build_service
from worker.settings import get_settings
from worker.upstreams.background import upstream_work

# How long a message whose result could not be published waits before it goes back to the queue.
REQUEUE_PAUSE_S = 0.5
# The service of this process, and what runs beside it on the loop (the approvals' sweep, webhook deliveries,
# following definitions versions).
_service: tuple[int, Service, list[Future[None]]] | None = None
_lock = threading.Lock()


def process_service() -> Service:
    """The service of this process, built on first use (and again in a forked child)."""
    global _service
    with _lock:
        if _service is None or _service[0] != os.getpid():
            settings = get_settings()
            bundles = redis_store.Bundles() if settings.store == "redis" else None
            service = build_service(settings, bundles)
            sweep = approvals.sweep_forever(service.publisher.client, service.publisher)
            beside = [asyncio.run_coroutine_threadsafe(sweep, process_loop().loop)]
            if service.deliveries is not None:  # webhooks: this process delivers its share of what is due
                beside.append(asyncio.run_coroutine_threadsafe(service.deliveries.run(), process_loop().loop))
            if bundles is not None:
                follow = redis_store.follow(
                    service.publisher.client,
                    bundles,
                    service.definitions_version,
                    settings.store_poll_seconds,
                    service.switch,
                )
                beside.append(asyncio.run_coroutine_threadsafe(follow, process_loop().loop))
            for work in upstream_work(
                service.runtime,
                lambda: service.defined,
                service.relist,
                settings.store_poll_seconds,
                settings.audit_stream_maxlen,
            ):  # MCP upstreams: their listings refreshed when due, and served as stored
                beside.append(asyncio.run_coroutine_threadsafe(work, process_loop().loop))
            _service = (os.getpid(), service, beside)
        return _service[1]


def close_process_service(timeout_s: float = 5.0) -> None:
    """Stop following versions and delivering webhooks, and close the service's connections (a worker that
    stops)."""
    global _service
    with _lock:
        if _service is None or _service[0] != os.getpid():
            return
        _, service, beside = _service
        _service = None
    for future in beside:
        future.cancel()
    process_loop().run(service.close(), timeout_s)
    tracing.flush(timeout_s)


def serve_task(
    task: str, task_id: str, payload: Any, delivery_info: Mapping[str, Any] | None, over_quota: Any = None
) -> Coroutine[Any, Any, Any]:
    """The work of one task message, ending with the task's result: `execute` carries a call (its
    summary), `execute_batch` a list of them (theirs). kombu marks every message it delivers again
    (restored after a lost worker or connection) `redelivered`; the take marks a message of a tenant over
    its max_queued (`over_quota`: the limit), whose calls are refused. Bounded by the visibility timeout,
    on whichever path it runs, since it cannot be of use once the message is delivered again anyway."""
    service = process_service()  # built at worker start; never on the loop
    redelivered = bool((delivery_info or {}).get("redelivered", True))
    limit = _limit(over_quota)
    if task == TASK_EXECUTE:
        work: Awaitable[Any] = _first(service.serve([payload], task_id, False, redelivered, limit))
    else:
        calls = payload if isinstance(payload, list) else [payload]
        work = service.serve(calls, task_id, True, redelivered, limit)
    return _bounded(work, get_settings().visibility_timeout_seconds)


def _limit(over_quota: Any) -> int | None:
    try:
        return None if over_quota is None else int(over_quota)
    except (TypeError, ValueError):
        return None  # not the take's mark: a producer's own header


async def _bounded(work: Awaitable[Any], limit_s: float) -> Any:
    try:
        async with asyncio.timeout(limit_s):  # in this task: wait_for would start a task of its own for the work
            return await work
    except PublishFailed as exc:  # Celery then rejects the message with requeue, on either pool
        # A pause first, so that a Redis refusing writes is not sent the same call in a tight loop.
        await asyncio.sleep(REQUEUE_PAUSE_S)
        raise Reject(str(exc), requeue=True) from exc


async def _first(summaries: Awaitable[list[dict[str, Any]]]) -> dict[str, Any] | None:
    done = await summaries
    return done[0] if done else None


def run_task(
    task: str, task_id: str, payload: Any, delivery_info: Mapping[str, Any] | None, over_quota: Any = None
) -> Any:
    """Bridge from a Celery pool thread to the process loop (the bound is inside `serve_task`)."""
    return process_loop().run(serve_task(task, task_id, payload, delivery_info, over_quota))
