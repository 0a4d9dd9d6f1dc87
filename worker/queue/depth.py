"""Queue depth and calls held, per queue, read from Redis when Prometheus scrapes: an autoscaler's signal.

    toolworker_queue_depth{queue}      messages waiting (every priority of the queue)
    toolworker_queue_in_flight{queue}  messages taken by any worker and not yet acknowledged

Both are fleet-wide (every worker exports the same values): aggregate them with max(), not sum().
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import redis
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.queue.leases import INFLIGHT_PREFIX

log = structlog.get_logger("toolworker.metrics")
# kombu's Redis transport keeps priorities 3, 6 and 9 of a queue in lists of their own (its default steps).
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


class QueueDepth(Collector):
    def __init__(self, client: redis.Redis, queues: Sequence[str]) -> None:
        self._client = client
        self._queues = tuple(queues)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families, without reading Redis (prometheus-client calls this when registering)."""
        return iter(_families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth, held = _families()
        try:
            for queue in self._queues:
                depth.add_metric([queue], self._waiting(queue))
                held.add_metric([queue], self._held(queue))
        except redis.RedisError as exc:  # a scrape without them beats a failed scrape
            log.warning("metrics.queue_depth_failed", error=str(exc))
            return
        yield depth
        yield held

    def _waiting(self, queue: str) -> int:
        with self._client.pipeline(transaction=False) as pipe:
            for suffix in _PRIORITY_SUFFIXES:
                pipe.llen(queue + suffix)
            return sum(pipe.execute())

    def _held(self, queue: str) -> int:
        keys = [key for key in self._client.scan_iter(match=f"{INFLIGHT_PREFIX}*", count=1000) if _of(key, queue)]
        if not keys:
            return 0
        with self._client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.llen(key)
            return sum(pipe.execute())


def _of(key: bytes, queues: Iterable[str] | str) -> bool:
    """Whether an in-flight list (`...:<holder host>:<pid>:<id>:<queue key>`) holds messages of the queue."""
    source = key.decode().split(":", 5)[-1]
    return source.split("\x06\x16", 1)[0] in ((queues,) if isinstance(queues, str) else tuple(queues))


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    depth = GaugeMetricFamily("toolworker_queue_depth", "Messages waiting in a queue.", labels=["queue"])
    held = GaugeMetricFamily(
        "toolworker_queue_in_flight", "Messages taken from a queue and not yet acknowledged.", labels=["queue"]
    )
    return depth, held
