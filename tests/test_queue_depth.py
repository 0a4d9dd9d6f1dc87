"""The queue gauges an autoscaler reads: messages waiting (every priority) and held, per queue."""

from __future__ import annotations

import fakeredis

from worker.queue import scheduler
from worker.queue.depth import QueueDepth
from worker.queue.leases import HOLDERS_KEY, inflight_key


def test_waiting_and_held_are_counted_per_queue() -> None:
    """Waiting counts every priority list of a queue; held counts the in-flight lists of every live holder
    (the holders' set) for the tenants with calls running, a named tenant's too; a list of no live holder's
    (its lease lapsed: the live workers put it back) is not counted."""
    client = fakeredis.FakeRedis()
    client.sadd(HOLDERS_KEY, "host:1:aa", "host:2:bb")
    client.hset(scheduler.IN_FLIGHT_KEY, mapping={"default": 4, "acme": 2, "idle": 0})
    client.lpush("toolcalls", "a", "b")
    client.lpush("toolcalls\x06\x169", "c")
    client.lpush("support", "d")
    client.lpush(inflight_key("host:1:aa", "toolcalls"), "e")
    client.lpush(inflight_key("host:2:bb", "toolcalls\x06\x163"), "f", "g")
    client.lpush(inflight_key("host:2:bb", "support"), "h")
    client.lpush(inflight_key("host:1:aa", scheduler.tenant_list("support", "acme")), "i", "j")
    client.lpush(inflight_key("host:9:gone", "support"), "k")
    families = {family.name: family for family in QueueDepth(client, ["toolcalls", "support"]).collect()}
    waiting = {sample.labels["queue"]: sample.value for sample in families["toolworker_queue_depth"].samples}
    held = {sample.labels["queue"]: sample.value for sample in families["toolworker_queue_in_flight"].samples}
    assert waiting == {"toolcalls": 3, "support": 1}
    assert held == {"toolcalls": 3, "support": 3}
