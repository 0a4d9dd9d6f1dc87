"""Bounded waits for what a test cannot await: a condition polled until it holds, or an AssertionError."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.05


def wait_until(predicate: Callable[[], object], timeout_s: float = 20.0, what: str = "the condition") -> None:
    """Poll `predicate` until it is true; fail the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        _fail_after(deadline, timeout_s, what)
        time.sleep(POLL_S)


async def wait_until_async(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """`wait_until` for a test running on an event loop: the loop keeps running while it waits."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        _fail_after(deadline, timeout_s, what)
        await asyncio.sleep(POLL_S)


def _fail_after(deadline: float, timeout_s: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
