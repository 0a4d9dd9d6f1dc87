"""Which task messages the worker pool starts on the event loop itself (the rest take Celery's path)."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from typing import Any

import pytest

from worker.constants import TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.queue.pool import TaskPool, _call_payload

CALL = {"callId": "c1", "tool": "t", "arguments": {}}


def request(task: str, args: Any, kwargs: Any = None, content_type: str | None = "application/json") -> tuple[Any, ...]:
    """The arguments Celery's request hands the pool: name, id, request, body, content type, encoding."""
    body: Any = [args, kwargs or {}, {}]
    if content_type:
        body = json.dumps(body).encode()
    return (task, "task-id", {"delivery_info": {"redelivered": False}}, body, content_type, "utf-8")


@pytest.mark.parametrize(
    ("task", "args", "expected"),
    [
        (TASK_EXECUTE, [CALL], (CALL,)),
        (TASK_EXECUTE_BATCH, [[CALL, CALL]], ([CALL, CALL],)),
        (TASK_EXECUTE, [None], (None,)),  # answered with an invalid-message envelope, on the loop too
    ],
)
def test_call_messages_run_on_the_loop(task: str, args: Any, expected: Any) -> None:
    assert _call_payload(request(task, args)) == expected


def test_an_already_decoded_body_is_taken_as_it_is() -> None:
    assert _call_payload(request(TASK_EXECUTE, [CALL], content_type=None)) == (CALL,)


@pytest.mark.parametrize(
    "args",
    [
        request("some.other_task", [CALL]),
        request(TASK_EXECUTE, [], {"message": CALL}),  # keyword arguments: Celery maps them
        request(TASK_EXECUTE, [CALL, CALL]),
        (TASK_EXECUTE, "task-id", {}, b"{not json", "application/json", "utf-8"),
        (TASK_EXECUTE, "task-id", {}, b"<x/>", "application/xml", "utf-8"),  # not an accepted content type
        (TASK_EXECUTE, "task-id"),
    ],
)
def test_anything_else_takes_celerys_path(args: tuple[Any, ...]) -> None:
    assert _call_payload(args) is None


def test_answered_messages_are_all_completed_even_when_one_completion_fails() -> None:
    """Messages answered together are completed by one pool thread, in order; a completion that raises is
    logged and the others still run (no message is left unacknowledged)."""
    pool = TaskPool(limit=2)
    completed: list[Any] = []

    def callback(outcome: Any) -> None:
        completed.append(outcome[1])
        if outcome[1] == repr({"n": 1}):
            raise RuntimeError("Celery's completion failed")

    futures = []
    for n in range(5):
        future: Future[Any] = Future()
        future.set_result({"n": n})
        futures.append(future)
    with pool._idle:
        pool._pending = len(futures)
    try:
        for future in futures:
            pool._answered(callback, time.monotonic(), future)
        with pool._idle:
            assert pool._idle.wait_for(lambda: pool._pending == 0, timeout=10)
    finally:
        pool.executor.shutdown(wait=True)
    assert completed == [repr({"n": n}) for n in range(5)]
