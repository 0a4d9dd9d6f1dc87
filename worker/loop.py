"""One long-lived asyncio loop in a background thread, shared by every thread of the process.

The loop is uvloop's (libuv under asyncio's interface, as the gateway's uvicorn runs on): every call, MCP session
and publication runs on it, for a fifth less worker CPU per MCP call than on the stock loop
(docs/guides/performance.md, "The worker's loop")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import wait
from typing import Any, TypeVar

import uvloop

from worker import logs

T = TypeVar("T")


class LoopThread:
    """Runs coroutines from synchronous threads on one persistent loop (connection pools survive)."""

    def __init__(self, name: str = "toolworker-loop") -> None:
        self.loop = uvloop.new_event_loop()
        running = threading.Event()
        self.loop.call_soon(running.set)  # the loop's first step: it is running from then on
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        running.wait()  # a stop right after the start finds the loop running, and runs its cleanup

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def thread_id(self) -> int | None:
        return self._thread.ident

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        # Waited for apart from its result: a TimeoutError the coroutine raises (a client's RedisLost is
        # one) must reach the caller as it is, not be taken for this wait running out.
        if not wait([future], timeout_s).done:
            future.cancel()
            raise TimeoutError(f"the coroutine did not finish within {timeout_s} s")
        return future.result()

    def stop(self, cleanup: Coroutine[Any, Any, Any] | None = None, timeout_s: float = 5.0) -> None:
        if cleanup is not None and self.loop.is_running():
            with contextlib.suppress(TimeoutError):  # stopping anyway; the process is going away
                self.run(cleanup, timeout_s)
        elif cleanup is not None:
            cleanup.close()  # a loop already stopped runs nothing more
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if logs.lines.holds_for(self.loop):  # its last turn's lines
            logs.lines.hold_for(None, None)
        if not self._thread.is_alive():
            self.loop.close()


_process_loop: tuple[int, LoopThread] | None = None
_lock = threading.Lock()


def process_loop() -> LoopThread:
    """The loop of this process, started on first use (and again in a forked child)."""
    global _process_loop
    with _lock:
        if _process_loop is None or _process_loop[0] != os.getpid():
            _process_loop = (os.getpid(), LoopThread())
            logs.lines.hold_for(_process_loop[1].loop, _process_loop[1].thread_id)
        return _process_loop[1]
