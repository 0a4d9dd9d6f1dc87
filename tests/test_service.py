"""The worker process's own housekeeping."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from celery.exceptions import Reject
from structlog.testing import capture_logs

from worker.constants import TASK_EXECUTE
from worker.heap import GC_THRESHOLDS, settle_heap
from worker.queue import bridge
from worker.queue.outcome import PublishFailed
from worker.queue.publisher import Publisher
from worker.queue.service import Service


def test_settle_heap_takes_the_start_up_heap_out_of_collections() -> None:
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 10_000  # the interpreter, pytest and the worker modules at least
        assert gc.get_threshold() == GC_THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


async def test_a_message_is_bounded_by_the_visibility_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The work of a message ends at the visibility timeout on the pool's fast path as on Celery's threads:
    by then the broker has handed the message out again."""

    class Stuck:
        async def serve(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            await asyncio.Event().wait()
            return []

    monkeypatch.setattr(bridge, "process_service", Stuck)
    monkeypatch.setattr(bridge, "get_settings", lambda: SimpleNamespace(visibility_timeout_seconds=0.05))
    with pytest.raises(TimeoutError):
        await bridge.serve_task(TASK_EXECUTE, "task-1", {"tool": "x"}, {"redelivered": False})


async def test_a_failed_publication_is_logged_and_hands_the_message_back() -> None:
    """When Redis refuses the result, serving the message fails with PublishFailed (never a quiet success
    that would be acknowledged) and the log says which call."""
    server = fakeredis.FakeServer()
    server.connected = False
    publisher = Publisher(fakeredis.FakeAsyncRedis(server=server), ttl_s=60, stream_maxlen=100)
    service = Service(runtime=None, publisher=publisher)  # type: ignore[arg-type]  # invalid calls need none
    with capture_logs() as logs, pytest.raises(PublishFailed):
        await service.serve([{"callId": "lost-1", "tool": ""}], "task-1", batch=False, redelivered=False)
    failed = [entry for entry in logs if entry["event"] == "call.publish_failed"]
    assert [entry["callId"] for entry in failed] == ["lost-1"]
    assert failed[0]["log_level"] == "error"


async def test_publish_failed_becomes_a_reject_with_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    """On either pool, a message whose result could not be published is rejected back onto the queue,
    not acknowledged (Celery acknowledges every other failure)."""

    class Unpublished:
        async def serve(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            raise PublishFailed("The result of call c could not be published.")

    monkeypatch.setattr(bridge, "process_service", Unpublished)
    monkeypatch.setattr(bridge, "REQUEUE_PAUSE_S", 0)
    with pytest.raises(Reject) as info:
        await bridge.serve_task(TASK_EXECUTE, "task-1", {"tool": "x"}, {"redelivered": False})
    assert info.value.requeue is True
