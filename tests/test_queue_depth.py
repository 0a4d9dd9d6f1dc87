"""The queue gauges an autoscaler reads: messages waiting (every priority) and held, per queue."""

from __future__ import annotations

import fakeredis

from worker.queue.depth import QueueDepth
from worker.queue.leases import inflight_key


def test_waiting_and_held_are_counted_per_queue() -> None:
    """Waiting counts every priority list of a queue; held counts the in-flight lists of every holder."""
    client = fakeredis.FakeRedis()
    client.lpush("toolcalls", "a", "b")
    client.lpush("toolcalls\x06\x169", "c")
    client.lpush("support", "d")
    client.lpush(inflight_key("host:1:aa", "toolcalls"), "e")
    client.lpush(inflight_key("host:2:bb", "toolcalls\x06\x163"), "f", "g")
    client.lpush(inflight_key("host:2:bb", "support"), "h")
    families = {family.name: family for family in QueueDepth(client, ["toolcalls", "support"]).collect()}
    waiting = {sample.labels["queue"]: sample.value for sample in families["toolworker_queue_depth"].samples}
    held = {sample.labels["queue"]: sample.value for sample in families["toolworker_queue_in_flight"].samples}
    assert waiting == {"toolcalls": 3, "support": 1}
    assert held == {"toolcalls": 3, "support": 1}
