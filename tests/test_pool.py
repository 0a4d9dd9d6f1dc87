"""Which task messages the worker pool starts on the event loop itself (the rest take Celery's path)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.constants import TASK_EXECUTE, TASK_EXECUTE_BATCH
from worker.queue.pool import _call_payload

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
