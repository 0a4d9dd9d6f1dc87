"""The Celery application: broker, result backend and delivery settings (SPEC §7)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import redis
import structlog
from celery import Celery
from celery.worker.consumer import Consumer

from worker.constants import DEAD_LETTER_KEY, DEAD_LETTER_MAX, DEFAULT_QUEUE
from worker.protocol import redacted_repr
from worker.settings import get_settings

log = structlog.get_logger("toolworker.app")


class DeadLetteringConsumer(Consumer):  # type: ignore[misc]
    """Messages that are not calls at all (undecodable, unknown task) are kept in a dead-letter list
    with the reason, and the worker goes on consuming."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        dead_letter("undecodable message", exc, message.body)
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        dead_letter("not a task message", None, body)
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter(f"unknown task {message.headers.get('task')!r}", exc, body)
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter("invalid task message", exc, body)
        super().on_invalid_task(body, message, exc)


def dead_letter(reason: str, exc: Exception | None, body: Any) -> None:
    """Record a rejected message; its content only in redacted form (it may carry call headers)."""
    raw = body if isinstance(body, bytes | str) else json.dumps(body, default=str)
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        shown = redacted_repr(json.loads(data))
    except ValueError:
        shown = None  # not JSON: keep only its size and digest
    entry = {
        "reason": reason,
        "error": str(exc)[:500] if exc else None,
        "body": shown,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "at": time.time(),
    }
    log.warning("message.dead_lettered", reason=reason, sha256=entry["sha256"])
    try:
        client = redis.Redis.from_url(get_settings().redis_url)
        with client.pipeline() as pipe:
            pipe.lpush(DEAD_LETTER_KEY, json.dumps(entry))
            pipe.ltrim(DEAD_LETTER_KEY, 0, DEAD_LETTER_MAX - 1)
            pipe.execute()
        client.close()
    except redis.RedisError as error:
        log.error("message.dead_letter_failed", error=str(error))


def create_app() -> Celery:
    settings = get_settings()
    transport_options = {"visibility_timeout": settings.visibility_timeout_seconds}
    app = Celery("toolworker", broker=settings.redis_url, backend=settings.redis_url, include=["worker.tasks"])
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_protocol=2,
        task_default_queue=DEFAULT_QUEUE,
        # At-least-once: ack after the result is published; a lost worker's message is sent again.
        task_acks_late=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport_options,
        result_backend_transport_options=transport_options,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Results are published by the task itself, exactly once per callId (worker/results.py).
        task_ignore_result=True,
        result_expires=settings.result_ttl_seconds,
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_soft_shutdown_timeout=10.0,
        worker_hijack_root_logger=False,
        worker_consumer="worker.app:DeadLetteringConsumer",
    )
    return app


app = create_app()
