"""Failover (SPEC §7): what a crash of the primary cuts short is made good. A command in flight on the
resilient client is retried on the promoted primary, and a settlement Redis never got (a restore, a reject
with requeue, an acknowledgement) is made good by the holder's next reconcile.

Real processes on loopback: a primary, two replicas and three Sentinels (tests/support/sentinel.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.sentinel import SentinelCluster
from worker.connections import connect
from worker.dev.embedded import EmbeddedRedis
from worker.queue import broker
from worker.queue.broker import process_holdings
from worker.queue.leases import Leases, inflight_key

# The bound on the outage: a new call is answered within 15 s of the primary's crash.
NEW_CALL_BUDGET_S = 15.0
LEASE_S = 2


def report(title: str, **figures: object) -> None:
    print(f"\n{title}: " + json.dumps(figures))


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_command_cut_by_the_crash_is_retried_on_the_promoted_primary(sentinel_cluster: SentinelCluster) -> None:
    """A command in flight on the resilient client when the primary dies is retried on the server the Sentinels
    promote, within 15 s (redis-py alone reconnects to the dead address until its retries run out, over a
    minute): a result published at that moment waits no longer than the failover."""
    cluster = sentinel_cluster

    async def scenario() -> Any:
        client = connect(cluster.url)
        try:
            await client.ping()
            waiting = asyncio.create_task(client.blpop(["nothing-comes"], timeout=3))
            await asyncio.sleep(0.5)  # the BLPOP is on the wire
            old = cluster.primary_port()
            killed_at = await asyncio.to_thread(cluster.crash, cluster.server(old))
            reply = await asyncio.wait_for(waiting, NEW_CALL_BUDGET_S)
            report("a command cut by the crash", answered_after_s=round(time.monotonic() - killed_at, 2))
            return reply, cluster.primary_port() != old
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (None, True)


@pytest.mark.integration
@pytest.mark.parametrize("requeue", [True, False])
def test_a_settlement_cut_by_a_crash_is_made_good_by_the_reconcile(redis_server: EmbeddedRedis, requeue: bool) -> None:
    """A reject with requeue that Redis never got (its call has no published result) is put back on
    its queue by the next reconcile; an acknowledgement that Redis never got is only removed."""
    client = redis.Redis.from_url(redis_server.url)
    leases = Leases(client, LEASE_S, "unacked", "unacked_index")
    raw = json.dumps({"properties": {"delivery_tag": f"tag-{uuid.uuid4().hex}"}, "body": "call"}).encode()
    tag = json.loads(raw)["properties"]["delivery_tag"]
    queue = f"q-{uuid.uuid4().hex}"
    inflight = inflight_key(leases.holder, queue)
    try:
        client.lpush(inflight, raw)
        holdings = process_holdings()
        holdings.hold(tag, inflight, raw)
        with pytest.raises(RedisConnectionError), broker._settling(tag, requeue):
            raise RedisConnectionError("the primary died")
        leases.reconcile(holdings.snapshot)
        assert (client.lrange(queue, 0, -1), client.llen(inflight)) == (([raw] if requeue else []), 0)
    finally:
        client.close()
