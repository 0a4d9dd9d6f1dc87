"""The fleet page's figures: per queue and tenant what `toolworker queue` prints, and the workers by their
Celery node names.

The node names come from a ping every worker answers (it waits its whole timeout: a second); the
answer is kept FRESH_S, and an older one is shown while a new ping runs in the background, so that only
the first page after a gateway starts waits for it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import redis

from worker.queue.depth import queue_rows
from worker.queue.health import nodes

FRESH_S = 10.0
PING_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Nodes:
    names: list[str]
    problem: str  # why none could be asked, or ""
    at: float


class Workers:
    def __init__(self, redis_url: str) -> None:
        self._redis_url = redis_url
        self._last: Nodes | None = None
        self._probe: asyncio.Task[Nodes] | None = None

    async def seen(self) -> Nodes:
        last = self._last
        if last is not None and time.monotonic() - last.at < FRESH_S:
            return last
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._ping())
        return last if last is not None else await asyncio.shield(self._probe)

    async def _ping(self) -> Nodes:
        try:
            found = Nodes(await asyncio.to_thread(nodes, self._redis_url, PING_TIMEOUT_S), "", time.monotonic())
        except RuntimeError as exc:
            found = Nodes([], str(exc), time.monotonic())
        self._last = found
        return found


async def tenant_rows(client: redis.Redis) -> list[dict[str, Any]]:
    """`toolworker queue --format json`'s rows, read off the event loop (the same code reads them)."""
    return await asyncio.to_thread(queue_rows, client)
