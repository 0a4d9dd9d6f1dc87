"""The process's event loop thread: coroutines from synchronous threads, bounded waits, a clean stop."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from worker.loop import LoopThread, process_loop


@pytest.fixture
def loop_thread() -> LoopThread:
    return LoopThread("test-loop")


def test_a_coroutine_runs_on_the_loop_thread(loop_thread: LoopThread) -> None:
    """`run` returns the coroutine's value, computed on the loop's own thread, and keeps the loop for the next."""

    async def where() -> str:
        return threading.current_thread().name

    try:
        assert loop_thread.run(where(), 5) == "test-loop"
        assert loop_thread.run(where(), 5) == "test-loop"
    finally:
        loop_thread.stop()


def test_a_coroutine_over_its_time_is_cancelled(loop_thread: LoopThread) -> None:
    """Past `timeout_s` the caller gets TimeoutError and the coroutine is cancelled, not left running."""
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with pytest.raises(TimeoutError, match=r"within 0\.5 s"):
            loop_thread.run(forever(), 0.5)
        assert started.is_set() and cancelled.wait(5)
    finally:
        loop_thread.stop()


def test_stop_runs_the_cleanup_then_closes_the_loop(loop_thread: LoopThread) -> None:
    """The cleanup coroutine runs on the loop before it stops; the loop is closed afterwards."""
    cleaned = []

    async def cleanup() -> None:
        cleaned.append(True)

    loop_thread.stop(cleanup())
    assert cleaned == [True] and loop_thread.loop.is_closed()


def test_one_loop_per_process() -> None:
    """Every caller in a process gets the same loop thread, started once."""
    first = process_loop()
    assert process_loop() is first
    assert first.run(asyncio.sleep(0, result=os.getpid()), 5) == os.getpid()
