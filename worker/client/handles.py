"""CallHandle: a call submitted by the synchronous client, whose envelope is waited for when asked."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.client.async_client import AsyncToolClient
from worker.constants import DEFAULT_CALL_TIMEOUT_S
from worker.envelope import ToolResult

# How a synchronous caller runs a coroutine of the client's loop, within a wait in seconds.
Runner = Callable[[Coroutine[Any, Any, ToolResult], float], ToolResult]


class CallHandle:
    """A submitted call; `.get(timeout)` waits for its envelope (and raises if it could not be enqueued)."""

    def __init__(self, client: AsyncToolClient, run: Runner, call_id: str, sent: Future[list[str]]) -> None:
        self._client = client
        self._run = run
        self._sent = sent
        self.call_id = call_id

    def get(self, timeout: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """Raises TimeoutError when the envelope does not come in time, RedisLost when Redis is gone."""
        started = time.monotonic()
        try:
            self._sent.result(timeout)
        except (FutureTimeout, RedisConnectionError, RedisTimeoutError) as exc:
            link = self._client.link_of_call(self.call_id)
            raise self._client.lost(f"while enqueuing call {self.call_id}", exc, timeout, link) from exc
        wait_s = max(0.0, started + timeout - time.monotonic())
        return self._run(self._client.result(self.call_id, wait_s), wait_s)
