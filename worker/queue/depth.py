"""Queue depth and calls held, per queue and per tenant, read from Redis when Prometheus scrapes: an
autoscaler's signal, and who is waiting.

    toolworker_queue_depth{queue}                messages waiting (every priority and tenant of the queue)
    toolworker_queue_in_flight{queue}            messages taken by any worker and not yet acknowledged
    toolworker_tenant_queue_depth{queue,tenant}  messages waiting, per tenant
    toolworker_tenant_in_flight{tenant}          calls taken and not yet acknowledged, per tenant

All are fleet-wide (every worker exports the same values): aggregate them with max(), not sum(). The
tenant label takes the tenants the definitions list (and `default`); every other tenant is counted under
`other`, so that callers cannot grow the number of series.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import redis
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.constants import DEFAULT_QUEUE, DEFAULT_TENANT, ROUTES_KEY
from worker.queue import ages, scheduler
from worker.queue.ages import AgeReader, scheduler_lists
from worker.queue.leases import HOLDERS_KEY, inflight_key
from worker.shards import Shard

log = structlog.get_logger("toolworker.metrics")
OTHER_TENANTS = "other"  # the label of every tenant the definitions do not list


def queue_rows(
    client: redis.Redis, queues: Sequence[str] = (), routes: redis.Redis | None = None
) -> list[dict[str, Any]]:
    """Per queue and tenant: messages waiting, calls queued and in flight, the oldest waiting and running call's
    age in seconds (`toolworker queue`, the console's
    fleet page). Queues: those named, else toolcalls and every routed queue (routes read from `routes`, the
    home shard, when given)."""
    routed: Any = (routes or client).hvals(ROUTES_KEY)
    chosen = list(queues) or sorted({DEFAULT_QUEUE, *(q.decode() for q in routed)})
    rows = [dataclasses.asdict(row) for row in scheduler.snapshot(client, chosen, scheduler.PRIORITY_SUFFIXES)]
    return ages.with_ages(rows, AgeReader(client).read(chosen))


def shard_rows(
    shards: Sequence[tuple[Shard, redis.Redis]], queues: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], list[str]]:
    """`queue_rows` of every shard, each row naming its shard (the routes read from the first, the home
    one); a shard that does not answer is left out and named in the second list."""
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    home = shards[0][1]
    for shard, client in shards:
        try:
            rows += [{"shard": shard.name} | row for row in queue_rows(client, queues, routes=home)]
        except (redis.RedisError, OSError) as exc:
            problems.append(f"{shard.where} does not answer: {exc}")
    return rows, problems


class QueueDepth(Collector):
    def __init__(self, client: redis.Redis, queues: Sequence[str]) -> None:
        self._client = client
        self._queues = tuple(queues)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families, without reading Redis (prometheus-client calls this when registering)."""
        return iter(_families() + _tenant_families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth, held = _families()
        tenant_depth, tenant_held = _tenant_families()
        try:
            rows = scheduler.snapshot(self._client, self._queues, scheduler.PRIORITY_SUFFIXES)
            flying = scheduler.in_flight(self._client)
            taken = self._held({tenant for tenant, count in flying.items() if count > 0})
            for queue in self._queues:
                depth.add_metric([queue], sum(row.waiting for row in rows if row.queue == queue))
                held.add_metric([queue], taken[queue])
            self._per_tenant(rows, flying, tenant_depth, tenant_held)
        except redis.RedisError as exc:  # a scrape without them beats a failed scrape
            log.warning("metrics.queue_depth_failed", error=str(exc))
            return
        yield from (depth, held, tenant_depth, tenant_held)

    def _per_tenant(
        self, rows: list[scheduler.TenantRow], flying: dict[str, int], depth: GaugeMetricFamily, held: GaugeMetricFamily
    ) -> None:
        listed = scheduler.listed_tenants(self._client) | {DEFAULT_TENANT}
        waiting: Counter[tuple[str, str]] = Counter({(q, t): 0 for q in self._queues for t in listed})
        for row in rows:
            waiting[row.queue, row.tenant if row.tenant in listed else OTHER_TENANTS] += row.waiting
        for (queue, tenant), count in sorted(waiting.items()):
            depth.add_metric([queue, tenant], count)
        calls: Counter[str] = Counter(dict.fromkeys(listed, 0))
        for tenant, count in flying.items():
            calls[tenant if tenant in listed else OTHER_TENANTS] += count
        for tenant, count in sorted(calls.items()):
            held.add_metric([tenant], count)

    def _held(self, running: set[str]) -> dict[str, int]:
        """Messages taken and not yet acknowledged, per queue: the in-flight lists of every live worker
        (the holders' set) for the tenants with calls running, named rather than found by a scan of the
        keyspace, and counted in one round trip."""
        holders = sorted(h.decode() if isinstance(h, bytes) else h for h in self._client.smembers(HOLDERS_KEY))
        keys = {
            queue: [inflight_key(h, key) for t in sorted(running) for key in scheduler_lists(queue, t) for h in holders]
            for queue in self._queues
        }
        with self._client.pipeline(transaction=False) as pipe:
            for group in keys.values():
                for key in group:
                    pipe.llen(key)
            lengths = iter(pipe.execute())
        return {queue: sum(next(lengths) for _ in group) for queue, group in keys.items()}


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    depth = GaugeMetricFamily("toolworker_queue_depth", "Messages waiting in a queue.", labels=["queue"])
    held = GaugeMetricFamily(
        "toolworker_queue_in_flight", "Messages taken from a queue and not yet acknowledged.", labels=["queue"]
    )
    return depth, held


def _tenant_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    depth = GaugeMetricFamily(
        "toolworker_tenant_queue_depth", "Messages waiting in a queue, per tenant.", labels=["queue", "tenant"]
    )
    held = GaugeMetricFamily(
        "toolworker_tenant_in_flight", "Calls taken and not yet acknowledged, per tenant.", labels=["tenant"]
    )
    return depth, held
