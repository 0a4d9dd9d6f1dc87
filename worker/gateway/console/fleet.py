"""The fleet page's figures: per queue and tenant (and shard) what `toolworker queue` prints, and the workers
by their Celery node names.

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

from worker.queue.depth import shard_rows
from worker.queue.health import nodes
from worker.shards import Shard

FRESH_S = 10.0
PING_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Nodes:
    names: list[str]
    problem: str  # why none could be asked, or ""
    at: float


class Workers:
    """The worker processes of every shard (each answers pings on its own shard's broker)."""

    def __init__(self, redis_urls: list[str]) -> None:
        self._redis_urls = redis_urls
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
        pings = (asyncio.to_thread(nodes, url, PING_TIMEOUT_S) for url in self._redis_urls)
        answers = await asyncio.gather(*pings, return_exceptions=True)
        names = sorted(name for answer in answers if isinstance(answer, list) for name in answer)
        problems = [str(answer) for answer in answers if isinstance(answer, RuntimeError)]
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, RuntimeError):
                raise answer
        found = Nodes(names, "; ".join(problems), time.monotonic())
        self._last = found
        return found


async def tenant_rows(shards: list[tuple[Shard, redis.Redis]]) -> tuple[list[dict[str, Any]], list[str]]:
    """`toolworker queue --format json`'s rows (and the shards that did not answer), read off the event loop
    (the same code reads them)."""
    return await asyncio.to_thread(shard_rows, shards)
