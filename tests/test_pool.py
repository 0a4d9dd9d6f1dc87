"""Which task messages the worker pool starts on the event loop itself (the rest take Celery's path)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from kombu.asynchronous import Hub, get_event_loop, set_event_loop

from worker.constants import TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.queue.pool import TaskPool, _call_payload, summary_repr

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


def answered(values: list[Any]) -> list[Future[Any]]:
    futures = []
    for value in values:
        future: Future[Any] = Future()
        future.set_result(value)
        futures.append(future)
    return futures


def test_answered_messages_are_all_completed_even_when_one_completion_fails() -> None:
    """Messages answered together are completed in order, with no consumer loop by one pool thread; a
    completion that raises is logged and the others still run (no message is left unacknowledged)."""
    assert get_event_loop() is None
    pool = TaskPool(limit=2)
    completed: list[Any] = []

    def callback(outcome: Any) -> None:
        completed.append(outcome[1])
        if outcome[1] == repr({"n": 1}):
            raise RuntimeError("Celery's completion failed")

    futures = answered([{"n": n} for n in range(5)])
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


@pytest.fixture
def consumer_loop() -> Iterator[tuple[Hub, threading.Thread]]:
    """A running kombu hub, as Celery's consumer runs it (the process's current one)."""
    hub = Hub()
    set_event_loop(hub)
    thread = threading.Thread(target=hub.run_forever, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while hub._loop_thread is None and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield hub, thread
    finally:
        hub.stop()
        thread.join(10)
        hub.close()
        set_event_loop(None)


def test_answered_messages_are_completed_on_the_consumers_loop(consumer_loop: tuple[Hub, threading.Thread]) -> None:
    """Celery's completion (task event, acknowledgement) runs on the consumer's loop, which makes the
    acknowledgement anyway: no pool thread is woken for it."""
    _, thread = consumer_loop
    pool = TaskPool(limit=2)
    ran_on: list[int | None] = []
    futures = answered([{"n": n} for n in range(3)])
    with pool._idle:
        pool._pending = len(futures)
    for future in futures:
        pool._answered(lambda outcome: ran_on.append(threading.get_ident()), time.monotonic(), future)
    with pool._idle:
        assert pool._idle.wait_for(lambda: pool._pending == 0, timeout=10)
    assert ran_on == [thread.ident] * 3


def test_a_warm_shutdown_completes_what_the_stopped_consumer_loop_left() -> None:
    """Celery stops its consumer's loop before the pool: the messages answered after that (their completion
    handed to a loop that no longer turns) are completed by the pool's stop, which then returns."""
    hub = Hub()
    hub._loop_thread = threading.get_ident()  # a consumer loop that ran and has stopped
    set_event_loop(hub)
    pool = TaskPool(limit=2)
    completed: list[Any] = []
    futures = answered(["late"])
    try:
        with pool._idle:
            pool._pending = 1
        pool._answered(lambda outcome: completed.append(outcome[1]), time.monotonic(), futures[0])
        stopping = threading.Thread(target=pool.on_stop, daemon=True)
        stopping.start()
        stopping.join(10)
        assert not stopping.is_alive()
        assert completed == [repr("late")]
    finally:
        hub.close()
        set_event_loop(None)


@pytest.mark.parametrize(
    "summaries",
    [
        {"callId": "c1", "tool": "t", "exitCode": 0, "statusCode": 200},
        [{"callId": f"c{i}", "tool": "t", "exitCode": 0, "statusCode": 200} for i in range(3)],
        {"callId": "c1", "tool": "t", "exitCode": 22, "error": {"type": "http_error", "message": "x" * 2000}},
    ],
    ids=["one call", "a batch", "a long error"],
)
def test_a_result_is_shown_as_its_summaries_repr_within_the_cap(summaries: Any) -> None:
    """What Flower shows of a message's result is the repr of its summaries, cut at 1,024 characters."""
    shown = summary_repr(summaries)
    full = repr(summaries)
    assert shown == full if len(full) <= 1024 else (len(shown) == 1024 and shown == full[:1021] + "...")


def test_a_large_batch_is_shown_by_its_first_summaries() -> None:
    """A batch of thousands of calls is not written out whole to be cut: its first summaries and an ellipsis."""
    summaries = [{"callId": f"c{i}", "exitCode": 0} for i in range(100_000)]
    shown = summary_repr(summaries)
    assert shown.startswith("[{'callId': 'c0', 'exitCode': 0}, {'callId': 'c1'") and shown.endswith("...]")
    assert "c99999" not in shown and len(shown) <= 1024
