"""The Celery application: broker, result backend and delivery settings (SPEC §7)."""

from __future__ import annotations

from celery import Celery

from worker.constants import DEFAULT_QUEUE
from worker.settings import get_settings


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
    )
    return app


app = create_app()
