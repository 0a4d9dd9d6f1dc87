"""Tenants at their seams: the `tenants:` section, what publish writes, the client's batches and refusals,
the per-tenant gauges (bounded labels), `toolworker queue`, and Flower's view of a tenant's call."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import fakeredis
import pytest
from prometheus_client import CollectorRegistry

from worker.cli import main
from worker.client import AsyncToolClient
from worker.constants import DEFAULT_QUEUE, TASK_EXECUTE, TENANT_LIMITS_KEY
from worker.definitions import redis_store
from worker.definitions.file_store import load
from worker.dev.embedded import EmbeddedRedis
from worker.errors import DeadlineExceeded, TenantQueueFull
from worker.protocol import task_message
from worker.queue import scheduler
from worker.queue.depth import QueueDepth

TENANTS = """
tenants:
  default: {weight: 2, max_in_flight: 50}
  bulk: {weight: 1, max_in_flight: 200, max_queued: 100000}
  live: {weight: 4, rate_limit: {per_second: 50, burst: 20}}
upstreams: {}
tools: []
"""
BROKEN = """
tenants:
  "no spaces": {weight: 1}
  zero: {weight: 0}
  typo: {wieght: 2}
"""


def test_the_tenants_section_is_read_and_an_unlisted_tenant_gets_defaults(tmp_path: Path) -> None:
    """Weights and limits are read; a tenant not listed gets the default tenant's, under its own name."""
    toolset = load([_write(tmp_path, TENANTS)], environ={})
    assert toolset.problems == []
    assert toolset.tenants["bulk"].max_queued == 100000 and toolset.tenants["bulk"].max_in_flight == 200
    live = toolset.tenants["live"]
    assert live.weight == 4 and live.rate_limit is not None and live.rate_limit.burst == 20
    other = toolset.tenant("someone")
    assert (other.name, other.weight, other.max_in_flight) == ("someone", 2, 50)


def test_bad_tenants_are_problems_with_their_line(tmp_path: Path) -> None:
    """A bad tenant name, a weight of 0 and an unknown key are each reported, with file and line."""
    toolset = load([_write(tmp_path, BROKEN)], environ={})
    text = [str(p) for p in toolset.problems]
    assert len(text) == 3 and all("tenants.yaml:" in t for t in text)
    assert any("no spaces" in t for t in text) and any("weight" in t for t in text)
    assert any("wieght" in t for t in text)
    assert toolset.tenants == {}


def test_publish_writes_the_tenant_limits(tmp_path: Path) -> None:
    """Publishing a set makes its tenants' limits the ones the takes read (0: no limit)."""
    r = fakeredis.FakeRedis()
    version, _ = redis_store.publish(r, [_write(tmp_path, TENANTS)])
    assert version == 1
    table = {k.decode(): v.decode() for k, v in r.hgetall(TENANT_LIMITS_KEY).items()}
    assert table == {"bulk": "1 200 100000", "default": "2 50 0", "live": "4 0 0"}


async def test_the_client_batches_within_max_in_flight_and_refuses_over_max_queued() -> None:
    """A tenant's batches are no larger than its max_in_flight; over max_queued nothing is enqueued."""
    client = AsyncToolClient("redis://127.0.0.1:9/0", tenant="capped")
    client.routing.home.redis = fakeredis.aioredis.FakeRedis()
    client.routing.home.reader_redis = fakeredis.aioredis.FakeRedis()
    await client.routing.home.redis.hset(TENANT_LIMITS_KEY, mapping={"capped": "1 10 0", "small": "1 0 2"})
    await client.submit_many([("a", {})] * 25, timeout=5)
    raw = await client.routing.home.redis.lrange(scheduler.tenant_list(DEFAULT_QUEUE, "capped"), 0, -1)
    assert sorted(scheduler.calls_in(m) for m in raw) == [5, 10, 10]
    with pytest.raises(TenantQueueFull, match="'small'") as raised:
        await client.submit_many([("a", {})] * 3, timeout=5, tenant="small")
    assert raised.value.limit == 2 and len(client.replies.waiting) == 25  # the refused calls are not awaited
    assert await client.routing.home.redis.llen(scheduler.tenant_list(DEFAULT_QUEUE, "small")) == 0
    await client.aclose()


def test_per_tenant_gauges_name_listed_tenants_and_put_the_rest_under_other() -> None:
    """Depth and in flight per tenant: the listed tenants and default by name, every other one as `other`."""
    r = fakeredis.FakeRedis()
    r.hset(TENANT_LIMITS_KEY, mapping={"acme": "1 0 0"})
    for tenant, count in (("acme", 2), ("x1", 1), ("x2", 3)):
        with r.pipeline(transaction=False) as pipe:
            scheduler.enqueue(pipe, DEFAULT_QUEUE, tenant, ["{}"] * count, count)
            pipe.execute()
    r.hset(scheduler.IN_FLIGHT_KEY, mapping={"acme": 5, "x1": 1, "x9": 2, "default": 0})
    registry = CollectorRegistry()
    registry.register(QueueDepth(r, [DEFAULT_QUEUE]))  # type: ignore[arg-type]
    depth = {
        s.labels["tenant"]: s.value
        for m in registry.collect()
        if m.name == "toolworker_tenant_queue_depth"
        for s in m.samples
    }
    held = {
        s.labels["tenant"]: s.value
        for m in registry.collect()
        if m.name == "toolworker_tenant_in_flight"
        for s in m.samples
    }
    total = registry.get_sample_value("toolworker_queue_depth", {"queue": DEFAULT_QUEUE})
    assert depth == {"acme": 2, "default": 1, "other": 4}  # default: the wake-up item a tenant's push left
    assert held == {"acme": 5, "default": 0, "other": 3}
    assert total == 7


@pytest.mark.integration
def test_queue_command_prints_per_queue_and_tenant(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`toolworker queue --format json` lists each tenant of a queue with its waiting messages and counts."""
    import redis

    queue = f"tq-{uuid.uuid4().hex[:8]}"
    with redis.Redis.from_url(redis_server.url) as r, r.pipeline(transaction=False) as pipe:
        scheduler.enqueue(pipe, queue, "acme", ["{}", "{}"], 2)
        pipe.execute()
    monkeypatch.setenv("TOOLWORKER_REDIS_URL", redis_server.url)
    assert main(["queue", "-Q", queue, "--format", "json"]) == 0
    rows = {row["tenant"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["acme"]["queue"] == queue and rows["acme"]["waiting"] == 2 and rows["acme"]["queued"] >= 2
    assert rows["default"]["waiting"] == 1  # the wake-up item


def test_flower_shows_the_tenant_of_a_call() -> None:
    """The task's argsrepr (what Flower shows) names the call's tenant."""
    message = json.loads(
        task_message("c1", [{"callId": "c1", "tool": "t", "tenant": "acme"}], DEFAULT_QUEUE, TASK_EXECUTE)
    )
    assert '"tenant": "acme"' in message["headers"]["argsrepr"]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(text, encoding="utf-8")
    return path


async def test_a_tenant_rate_limit_ends_a_call_that_would_wait_past_its_deadline(tmp_path: Path) -> None:
    """A tenant's rate limit is shared through Redis; a call whose slot comes after its deadline ends with 75."""
    from worker.call.run import _tenant_rate
    from worker.call.runtime import Runtime

    slow = "tenants:\n  slow: {rate_limit: {per_second: 0.5, burst: 1}}\n"
    runtime = Runtime(load([_write(tmp_path, slow)], environ={}), {}, redis=fakeredis.aioredis.FakeRedis())
    deadline = time.time() + 1.0
    await _tenant_rate("slow", runtime, deadline)  # the burst: at once
    with pytest.raises(DeadlineExceeded, match=r"tenant's rate limit would make this call wait ([\d.]+) s") as ended:
        await _tenant_rate("slow", runtime, deadline)
    waited = re.search(r"wait ([\d.]+) s", str(ended.value))
    assert waited is not None and 1.9 <= float(waited[1]) <= 2.0  # a slot every 2 s, less the time since the burst
    for _ in range(5):  # another tenant is not held by it
        await _tenant_rate("other", runtime, deadline)
    await runtime.close()
