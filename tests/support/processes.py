"""Only tests marked `integration` start processes, so that `make test-fast` (`-m "not integration"`) starts
none: a unit test that starts one (a worker, a server, a command line) fails there, saying to mark it."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# Audit events (sys.addaudithook) that start a process.
STARTS_A_PROCESS = frozenset({"subprocess.Popen", "os.fork", "os.posix_spawn", "os.spawn"})


class _Running:
    """The node id of the unit test whose setup or body runs now on the main thread, if one does."""

    unit: str | None = None


def _refuse_processes(event: str, args: tuple[Any, ...]) -> None:
    if event in STARTS_A_PROCESS and _Running.unit and threading.current_thread() is threading.main_thread():
        what = args[1] if event == "subprocess.Popen" else args[:2]
        raise RuntimeError(f"{_Running.unit} starts a process ({what!r}): mark it @pytest.mark.integration")


sys.addaudithook(_refuse_processes)  # an audit hook stays for the process's life: _Running says when it acts


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _watching(item):
        return (yield)


@contextmanager
def _watching(item: pytest.Item) -> Iterator[None]:
    """While a unit test (one not marked `integration`) sets up or runs, starting a process raises."""
    _Running.unit = None if item.get_closest_marker("integration") else item.nodeid
    try:
        yield
    finally:
        _Running.unit = None
