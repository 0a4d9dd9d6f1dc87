"""The worker pool: tool-call messages run on the process's event loop, without a thread each.

Celery's thread pool gives every message a thread, which then sits blocked while the event loop does the
work: three threads hand each call along (consumer, pool thread, loop), and at light load those
hand-offs cost more than the call. Here the consumer starts a call message's coroutine on the loop
directly; when the call is answered, Celery's completion (task event, acknowledgement) runs back on the
consumer's own loop, off the event loop and after the result is out, where the acknowledgement is made
anyway. Any other task, or a body that does not decode, takes Celery's thread path unchanged. A warm
shutdown waits for the calls in flight and their acknowledgements.
Either way, a message handed to the pool is marked started for the broker transport: a connection lost
from then on leaves it held for its own acknowledgement rather than putting it back (broker.py).

The app names it by class path (`worker_pool`), so `toolworker worker` and `celery -A worker.app worker`
use it; `-P threads` still names Celery's own thread pool.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import cache, partial
from typing import Any

import structlog
from billiard.einfo import ExceptionInfo
from celery.concurrency import thread
from kombu.asynchronous import get_event_loop
from kombu.serialization import loads, prepare_accept_content

from worker.constants import ACCEPT_CONTENT, OVER_QUOTA_HEADER, TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.loop import process_loop
from worker.queue.bridge import serve_task
from worker.queue.holdings import process_holdings
from worker.queue.outcome import CallFailed, failure

log = structlog.get_logger("toolworker.pool")
_CALL_TASKS = frozenset({TASK_EXECUTE, TASK_EXECUTE_BATCH})
_RESULT_REPR_CHARS = 1024  # the summary shown in task events (Flower), as Celery's default
_REPR_ITEMS = 16  # a batch's summaries past these are not shown (each is some 80 characters)
_STOP_POLL_S = 0.05  # how often a warm shutdown completes the messages answered meanwhile


class TaskPool(thread.TaskPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending = 0  # call messages started and not yet acknowledged
        self._idle = threading.Condition()
        self._answers: deque[tuple[Callable[..., Any], Future[Any], float]] = deque()  # to complete
        self._completing = False  # their completion is under way

    def apply_async(self, target: Callable[..., Any], args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        # Not Celery's: at debug level it logs the raw task body, call header values included.
        options.setdefault("waitforslot", self.putlocks)
        options.setdefault("callbacks_propagate", self.callbacks_propagate)
        return self.on_apply(target, tuple(args or ()), kwargs or {}, **options)

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **options: Any,
    ) -> thread.ApplyResult:
        # Celery's request passes (task name, task id, request, body, content type, content encoding).
        _mark_started(args)
        payload = _call_payload(args) if args and callback else None
        if payload is None:
            return super().on_apply(target, args, kwargs, callback, accept_callback, **options)
        assert args is not None and callback is not None
        request = args[2] or {}
        work = serve_task(args[0], args[1], payload[0], request.get("delivery_info"), request.get(OVER_QUOTA_HEADER))
        future = asyncio.run_coroutine_threadsafe(work, process_loop().loop)
        if accept_callback:
            accept_callback(os.getpid(), time.monotonic())
        with self._idle:
            self._pending += 1
        future.add_done_callback(partial(self._answered, callback, time.monotonic()))
        return thread.ApplyResult(future)

    def _answered(self, callback: Callable[..., Any], started: float, future: Future[Any]) -> None:
        """On the loop, once every call of the message is answered: complete it on Celery's consumer loop, with
        the other messages answered meanwhile (one wake-up for them). Without a consumer loop (none ran yet), a
        pool thread completes them."""
        self._answers.append((callback, future, time.monotonic() - started))
        if not self._completing:
            self._completing = True
            hub = get_event_loop()
            if hub is not None and hub._loop_thread is not None:
                hub.call_soon(self._complete_answered)  # thread-safe; run before the hub polls again
            else:
                self.executor.submit(self._complete_answered)

    def _complete_answered(self) -> None:
        while True:
            while self._answers:
                answer = self._answers.popleft()
                try:
                    self._complete(*answer)
                except Exception:  # (the executor would have kept it) the next ones are still completed
                    log.exception("pool.completion_failed")
            self._completing = False  # then looked at again: an answer appended meanwhile is not left
            if not self._answers:
                return
            self._completing = True

    def _complete(self, callback: Callable[..., Any], future: Future[Any], runtime: float) -> None:
        try:
            try:  # the summary's repr (a batch's is long) is made here, off the loop
                summaries = future.result()
                outcome = _failed(failure(summaries), runtime) or (0, summary_repr(summaries), runtime)
            except BaseException:  # Celery's failure path acknowledges it (a Reject: hands it back instead)
                outcome = (1, ExceptionInfo(), runtime)
            callback(outcome)
        finally:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def on_stop(self) -> None:
        """A warm shutdown: the calls in flight finish and are acknowledged. Celery's consumer loop has stopped
        by now (the hub closes after the pool), so what it would have completed is completed here."""
        while True:
            self._complete_answered()
            with self._idle:
                if self._idle.wait_for(lambda: self._pending == 0, timeout=_STOP_POLL_S):
                    break
        super().on_stop()


def summary_repr(summaries: Any) -> str:
    """What task events (Flower) show of a message's result: the repr of its calls' summaries, at most
    _RESULT_REPR_CHARS (Celery's saferepr walks them in Python, and cost a message more than its event did)."""
    many = isinstance(summaries, list) and len(summaries) > _REPR_ITEMS
    text = repr(summaries[:_REPR_ITEMS])[:-1] + ", ...]" if many else repr(summaries)
    return text if len(text) <= _RESULT_REPR_CHARS else text[: _RESULT_REPR_CHARS - 3] + "..."


def _failed(failed: CallFailed | None, runtime: float) -> tuple[int, ExceptionInfo, float] | None:
    """Celery's failure outcome for a message whose calls failed: a task-failed event that names the error
    (no traceback: nothing raised), then the acknowledgement."""
    if failed is None:
        return None
    try:
        raise failed
    except CallFailed:
        info = ExceptionInfo()
    info.exception = failed  # billiard wraps it for pickling; the event would show the wrapper's repr
    return 1, info, runtime


def _mark_started(args: tuple[Any, ...] | None) -> None:
    """Tell the broker transport that the message runs here now, on either path: from here on a lost
    connection leaves it held for its own acknowledgement instead of putting it back (broker.py)."""
    request = args[2] if args and len(args) > 2 else None
    properties = request.get("properties") if isinstance(request, dict) else None
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    if isinstance(tag, str):
        process_holdings().started(tag)


def _call_payload(args: tuple[Any, ...]) -> tuple[Any] | None:
    """The call (or list of calls) of a tool-call task message; None for anything else."""
    if len(args) < 6 or args[0] not in _CALL_TASKS:
        return None
    body, content_type, content_encoding = args[3:6]
    try:
        positional, keywords = (
            loads(body, content_type, content_encoding, accept=_accept()) if content_type else body
        )[:2]
    except Exception:  # Celery's own path reports what is wrong with it
        return None
    # One positional argument, as toolworker's clients send it; any other shape takes Celery's path.
    return (positional[0],) if isinstance(positional, list | tuple) and len(positional) == 1 and not keywords else None


@cache
def _accept() -> frozenset[str]:
    return frozenset(prepare_accept_content(ACCEPT_CONTENT))
