"""Every test's timeout (pytest-timeout's, from pyproject.toml or a `timeout` mark) counted as the waits of
tests/support/waiting.py count theirs: in seconds of an unloaded machine, so that a test waiting on other
processes is not cut off because the machine is busy with other work; a hung test still stops."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import pytest
import pytest_timeout

from tests.support.waiting import Budget

# How often the alarm looks again at a budget it has not spent yet, at most.
RECHECK_S = 5.0


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Arm SIGALRM to fire when the test's budget is spent; other methods keep pytest-timeout's own timer."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None
    budget = Budget(settings.timeout)

    def alarm(signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        if budget.exhausted():
            pytest_timeout.timeout_sigalrm(item, settings)
        else:
            signal.setitimer(signal.ITIMER_REAL, min(max(budget.left_s(), 0.1), RECHECK_S))

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # where pytest-timeout's own cancel hook looks for it
    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True
