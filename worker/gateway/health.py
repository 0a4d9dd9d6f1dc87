"""Can the fleet take calls? Redis answers and a worker answers a ping (`toolworker health`'s check).

An answered call says as much, so while calls are answered the workers are not pinged at all (a ping
costs the gateway a Celery app and a broadcast: tens of ms of CPU). Otherwise the answer of a ping is
kept for a few seconds, so that neither `/healthz` probes nor calls ping each time. A call is refused
(503) only while the last answer said no; an old yes is renewed in the background while calls go on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

FRESH_S = 5.0
# A "no" is asked again sooner: a fleet that comes back (workers starting with the gateway) takes calls
# within a second.
DOWN_FRESH_S = 1.0
PING_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Status:
    ready: bool
    message: str
    at: float


class FleetUnavailable(Exception):
    """The fleet cannot take calls now (Redis or every worker is away)."""


class FleetHealth:
    def __init__(self, redis_url: str, fresh_s: float = FRESH_S, timeout_s: float = PING_TIMEOUT_S) -> None:
        self._redis_url = redis_url
        self._fresh_s = fresh_s
        self._timeout_s = timeout_s
        self._status: Status | None = None
        self._probe: asyncio.Task[Status] | None = None

    def answered(self) -> None:
        """A call was just answered by a worker: the fleet takes calls."""
        self._status = Status(True, "a worker answered a call", time.monotonic())

    async def status(self) -> Status:
        """A fresh answer (waits for a ping when the last one is old)."""
        status = self._status
        if status is not None and time.monotonic() - status.at < (self._fresh_s if status.ready else DOWN_FRESH_S):
            return status
        return await asyncio.shield(self._start_probe())

    async def admit(self) -> None:
        """Raise FleetUnavailable when the fleet cannot take a call."""
        status = self._status
        if status is None or not status.ready:
            status = await self.status()
        elif time.monotonic() - status.at >= self._fresh_s:
            self._start_probe()  # renewed in the background; the call goes on
        if not status.ready:
            raise FleetUnavailable(status.message)

    def _start_probe(self) -> asyncio.Task[Status]:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._ping())
        return self._probe

    async def _ping(self) -> Status:
        ready, message = await asyncio.to_thread(_check, self._redis_url, self._timeout_s)
        self._status = Status(ready, message, time.monotonic())
        return self._status


def _check(redis_url: str, timeout_s: float) -> tuple[bool, str]:
    from worker.queue.health import check  # the Celery app: imported by the first probe, off the event loop

    return check(redis_url, timeout_s)
