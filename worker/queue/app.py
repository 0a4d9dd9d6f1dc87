"""The Celery application: broker, result backend and delivery settings (SPEC §7)."""

from __future__ import annotations

import hashlib
import json
import re
import time
import warnings
from typing import Any

import redis
import structlog
from celery import Celery
from celery.exceptions import CPendingDeprecationWarning
from celery.signals import celeryd_after_setup
from celery.worker.consumer import Consumer

from worker.constants import DEAD_LETTER_KEY, DEAD_LETTER_MAX, DEFAULT_QUEUE
from worker.protocol import redacted_repr
from worker.queue import broker, pool
from worker.settings import get_settings

log = structlog.get_logger("toolworker.app")
_REPLY_TO = re.compile(r'"replyTo"\s*:\s*"([^"\\]{1,512})"')
_REPLY_TO_SCAN_CHARS = 1 << 20
_EVENTS_FLUSH_DELAY_S = 0.02


class DeadLetteringConsumer(Consumer):  # type: ignore[misc]
    """Messages that are not calls at all (undecodable, unknown task) are kept in a dead-letter list
    with the reason, and the worker goes on consuming.

    Task events leave in one flush a few milliseconds after the first is buffered, not at once: a
    call's received, started and succeeded events then go out together, after the call rather than
    while it runs (Celery flushes on the next loop turn, twice per message)."""

    _events_flush_scheduled = False

    def on_send_event_buffered(self) -> None:
        if self.hub and not self._events_flush_scheduled:
            self._events_flush_scheduled = True
            self.hub.call_soon(self._schedule_events_flush)  # thread-safe; the timer is not

    def _schedule_events_flush(self) -> None:
        self.hub.call_later(_EVENTS_FLUSH_DELAY_S, self._flush_events_later)

    def _flush_events_later(self) -> None:
        self._events_flush_scheduled = False  # first: an event buffered from now on schedules a flush
        self._flush_events()

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        dead_letter("undecodable message", exc, message.body)
        task_id = (message.headers or {}).get("id")
        if isinstance(task_id, str) and task_id:
            answer_undecodable(task_id, _reply_stream(message.body))
        # Not Celery's handler: it logs the start of the raw body, call-header values included.
        message.ack()

    def on_unknown_message(self, body: Any, message: Any) -> None:
        dead_letter("not a task message", None, body)
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter(f"unknown task {message.headers.get('task')!r}", exc, body)
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter("invalid task message", exc, body)
        super().on_invalid_task(body, message, exc)


def _reply_stream(body: Any) -> str | None:
    """The replyTo of a body that cannot be decoded, when its text names exactly one."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    found = _REPLY_TO.findall(text[:_REPLY_TO_SCAN_CHARS])
    return found[0] if len(found) == 1 else None


def answer_undecodable(task_id: str, reply_to: str | None) -> None:
    """Give a message that names its task id but cannot be decoded its one envelope (65)."""
    from worker.envelope import ToolResult
    from worker.errors import InvalidArguments
    from worker.loop import process_loop
    from worker.queue.service import process_service

    error = InvalidArguments("The tool call message could not be decoded (not JSON, or nested too deeply).")
    try:
        publisher = process_service().publisher
        process_loop().run(publisher.publish_one(ToolResult.failure(task_id, "?", error), reply_to), 30)
    except Exception as failure:  # the dead-letter entry still records the message
        log.error("message.answer_failed", callId=task_id, error=str(failure))


def dead_letter(reason: str, exc: Exception | None, body: Any) -> None:
    """Record a rejected message; its content only in redacted form (it may carry call headers)."""
    raw = body if isinstance(body, bytes | str) else json.dumps(body, default=str)
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        shown = redacted_repr(json.loads(data))
    except (ValueError, RecursionError):
        shown = None  # not JSON (or too deeply nested to read): keep only its size and digest
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


def _quiet_cancel_warning(**_: Any) -> None:
    """Celery warns at every reconnect that 6.0 will cancel running calls on connection loss; toolworker
    chooses not to (see create_app). Set after Celery's logging setup, which turns its warnings to 'always'."""
    warnings.filterwarnings("ignore", r"\s*In Celery 5\.1 we introduced", CPendingDeprecationWarning)


celeryd_after_setup.connect(_quiet_cancel_warning, weak=False)


def create_app() -> Celery:
    settings = get_settings()
    broker.use()
    pool.use()
    # A lost worker's unacknowledged calls come back once older than the visibility timeout; sweep for
    # them on every check (about every 10 s) rather than every tenth.
    transport_options = {"visibility_timeout": settings.visibility_timeout_seconds, "unacked_restore_throttle": 1}
    app = Celery("toolworker", broker=settings.redis_url, backend=settings.redis_url, include=["worker.queue.tasks"])
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
        # A call running when the broker connection drops finishes and publishes its result (the done key
        # makes the redelivered copy a no-op); cancelling it would only waste the upstream's work.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Results are published by the task itself, exactly once per callId (worker/results.py).
        task_ignore_result=True,
        result_expires=settings.result_ttl_seconds,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        worker_soft_shutdown_timeout=10.0,
        worker_hijack_root_logger=False,
        worker_consumer="worker.queue.app:DeadLetteringConsumer",
    )
    return app


app = create_app()
