"""Bounded waits for what a test cannot await: a condition polled until it holds, or an AssertionError.

A budget is counted in seconds of a machine with a core for every runnable process: while the machine
runs more processes than it has cores (other work beside the suite, the suite's own parallel processes),
each second of the clock counts for less, as the processes waited on get only their share of a core.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

POLL_S = 0.05


def load_factor() -> float:
    """How many times slower than on an idle machine a process runs now: the runnable processes per core
    over the last minute, and 1 while there is a core to spare."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def scaled(budget_s: float) -> float:
    """A budget for something other processes do (a call answered, a worker started), stretched by how
    busy the machine is now: for a timeout handed to code that counts the clock itself."""
    return budget_s * load_factor()


class Budget:
    """`budget_s` seconds of an unloaded machine, spent more slowly while the machine is busy."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.spent_s = 0.0
        self._last = time.monotonic()

    def exhausted(self) -> bool:
        now = time.monotonic()
        self.spent_s += (now - self._last) / load_factor()
        self._last = now
        return self.spent_s > self.budget_s

    def left_s(self) -> float:
        """At least how long the clock may run before the budget is spent."""
        return max(0.0, self.budget_s - self.spent_s)


def wait_until(predicate: Callable[[], object], timeout_s: float = 20.0, what: str = "the condition") -> None:
    """Poll `predicate` until it is true; fail the test naming `what` once `timeout_s` (scaled) is spent."""
    budget = Budget(timeout_s)
    while not predicate():
        _fail_if_spent(budget, what)
        time.sleep(POLL_S)


async def wait_until_async(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """`wait_until` for a test running on an event loop: the loop keeps running while it waits."""
    budget = Budget(timeout_s)
    while not predicate():
        _fail_if_spent(budget, what)
        await asyncio.sleep(POLL_S)


def _fail_if_spent(budget: Budget, what: str) -> None:
    if budget.exhausted():
        raise AssertionError(f"timed out after {budget.budget_s} s (scaled by the machine's load) waiting for {what}")
