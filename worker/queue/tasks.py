"""The Celery tasks `toolcall.execute` and `toolcall.execute_batch`; the work is done on the process loop."""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.exceptions import Reject
from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown
from celery.worker.request import Request

from worker import metrics
from worker.connections import NotReplicated
from worker.constants import TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.protocol import redacted_repr
from worker.queue.app import app
from worker.queue.bridge import close_process_service, process_service, run_task
from worker.queue.heap import settle_heap
from worker.queue.outcome import CallFailed, failure


class RedactedRequest(Request):  # type: ignore[misc]
    """Task events (and so Flower) show calls with their header values redacted, whoever enqueued them."""

    @property
    def argsrepr(self) -> str:
        return redacted_repr(list(self.args or ()))

    @property
    def kwargsrepr(self) -> str:
        return "{}"


class CallTask(Task):  # type: ignore[misc]
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
    summary: dict[str, Any] | None = _run(TASK_EXECUTE, self.request, message)
    _raise_if_failed(summary)
    return summary


@app.task(base=CallTask, bind=True, name=TASK_EXECUTE_BATCH)
def execute_batch(self: CallTask, messages: Any = None) -> list[dict[str, Any]]:
    summaries: list[dict[str, Any]] = _run(TASK_EXECUTE_BATCH, self.request, messages)
    _raise_if_failed(summaries)
    return summaries


def _run(task: str, request: Any, payload: Any) -> Any:
    """The task's work; a result the replicas did not confirm (TOOLWORKER_REDIS_MIN_REPLICAS) puts the
    message back: delivered again, it is skipped if its result survived, and run again if a failover
    lost it."""
    try:
        return run_task(task, request.id, payload, request.delivery_info)
    except NotReplicated as exc:
        raise Reject(str(exc), requeue=True) from exc


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
