"""The worker process's own housekeeping."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

import pytest

from worker.constants import TASK_EXECUTE
from worker.heap import GC_THRESHOLDS, settle_heap
from worker.queue import bridge


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
