"""The Celery tasks `toolcall.execute` and `toolcall.execute_batch`; the work is done on the process loop."""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown
from celery.worker.request import Request

from worker import metrics
from worker.constants import OVER_QUOTA_HEADER, TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.heap import settle_heap
from worker.protocol import redacted_repr
from worker.queue.app import app
from worker.queue.bridge import close_process_service, process_service, run_task
from worker.queue.outcome import CallFailed, failure


class RedactedRequest(Request):
    """Task events (and so Flower) show calls with their header values redacted, whoever enqueued them."""

    @property
    def argsrepr(self) -> str:
        return redacted_repr(list(self.args or ()))

    @property
    def kwargsrepr(self) -> str:
        return "{}"


class CallTask(Task):
    Request = RedactedRequest
    acks_late = True
    # A worker lost mid-call gets the message resent, a bounded number of times.
    retry_on_worker_lost = True
    max_retries = 3
    ignore_result = True
    # A failed call is expected: Celery logs it in one line, without a traceback (the envelope says why).
    throws = (CallFailed,)


@app.task(base=CallTask, bind=True, name=TASK_EXECUTE)
def execute(self: CallTask, message: Any = None) -> dict[str, Any] | None:
    summary: dict[str, Any] | None = run_task(
        TASK_EXECUTE, self.request.id, message, self.request.delivery_info, _over_quota(self)
    )
    _raise_if_failed(summary)
    return summary


@app.task(base=CallTask, bind=True, name=TASK_EXECUTE_BATCH)
def execute_batch(self: CallTask, messages: Any = None) -> list[dict[str, Any]]:
    summaries: list[dict[str, Any]] = run_task(
        TASK_EXECUTE_BATCH, self.request.id, messages, self.request.delivery_info, _over_quota(self)
    )
    _raise_if_failed(summaries)
    return summaries


def _over_quota(task: CallTask) -> Any:
    """The tenant's max_queued that the take found exceeded (a header of the message), if it did."""
    return getattr(task.request, OVER_QUOTA_HEADER, None)


def _raise_if_failed(summaries: Any) -> None:
    """CallFailed when a call failed, so that Flower shows the message failed (the envelopes are out)."""
    failed = failure(summaries)
    if failed is not None:
        raise failed


@worker_ready.connect
def _load_at_start(**_: Any) -> None:
    """Load definitions (and publish routes) when the worker starts, so problems show at boot."""
    process_service()
    settle_heap()


@worker_process_shutdown.connect
def _forget_process_metrics(pid: int, **_: Any) -> None:
    """A prefork child that exits leaves no stale in-flight gauge behind, and closes its connections."""
    metrics.process_exited(pid)
    close_process_service()


@worker_shutdown.connect
def _close_service(**_: Any) -> None:
    """A stopping worker closes its HTTP pools and Redis connections once its calls are over."""
    close_process_service()
