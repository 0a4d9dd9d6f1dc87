"""The Celery application: broker, result backend and delivery settings (docs/concepts/delivery.md).

Celery and kombu are extended through their hooks: the consumer and the pool are named by class path
(`worker_consumer`, `worker_pool`). The broker transport is the exception (see `broker.register`).
"""

from __future__ import annotations

import warnings
from typing import Any

from celery import Celery
from celery.exceptions import CPendingDeprecationWarning
from celery.signals import celeryd_after_setup
from kombu import serialization
from kombu.utils import json as kombu_json

from worker import connections
from worker.constants import ACCEPT_CONTENT, DEFAULT_QUEUE
from worker.protocol import kombu_loads
from worker.queue import broker
from worker.settings import get_settings


def _quiet_cancel_warning(**_: Any) -> None:
    """Celery warns at every reconnect that 6.0 will cancel running calls on connection loss; toolworker
    chooses not to (see create_app). Set after Celery's logging setup, which turns its warnings to 'always'."""
    warnings.filterwarnings("ignore", r"\s*In Celery 5\.1 we introduced", CPendingDeprecationWarning)


celeryd_after_setup.connect(_quiet_cancel_warning, weak=False)


def create_app() -> Celery:
    settings = get_settings()
    broker.register()
    # Message bodies decoded as kombu decodes them, without its per-object hook where it would do nothing.
    serialization.register("json", kombu_json.dumps, kombu_loads, "application/json", "utf-8")  # type: ignore[no-untyped-call]  # kombu is unannotated
    # A lost worker's unacknowledged calls come back once older than the visibility timeout; sweep for
    # them on every check (about every 10 s) rather than every tenth.
    transport_options = {"visibility_timeout": settings.visibility_timeout_seconds, "unacked_restore_throttle": 1}
    url = settings.queue_url  # the process's shard (worker/shards.py), else TOOLWORKER_REDIS_URL
    transport_options |= connections.transport_options(url)  # a Sentinel URL's master name
    app = Celery("toolworker", broker=url, backend=url, include=["worker.queue.tasks"])
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=list(ACCEPT_CONTENT),
        task_protocol=2,
        task_default_queue=DEFAULT_QUEUE,
        # At-least-once: ack after the result is published; a lost worker's message is sent again.
        task_acks_late=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport_options,
        result_backend_transport_options=transport_options,
        broker_use_ssl=connections.celery_tls(url),
        redis_backend_use_ssl=connections.celery_tls(url),
        # A call running when the broker connection drops finishes, publishes its result and is acknowledged
        # on the new connection (its message stays held meanwhile: broker.py); cancelling it would only waste
        # the upstream's work.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Results are published by the task itself, exactly once per callId (worker/queue/publisher.py).
        task_ignore_result=True,
        result_expires=settings.result_ttl_seconds,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        worker_soft_shutdown_timeout=10.0,
        worker_hijack_root_logger=False,
        worker_consumer="worker.queue.consumer:DeadLetteringConsumer",
        # Calls run on the process's event loop (`-P threads` names Celery's own thread pool instead).
        worker_pool="worker.queue.pool:TaskPool",
    )
    return app


app = create_app()
