"""The age gauges: the oldest waiting and running call per queue and tenant, read from the lists' tails."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import fakeredis
import pytest
import redis

from tests.conftest import FIXTURES, Upstream, start_worker, stop_worker, worker_env
from tests.support.prometheus import scrape, wait_for_sample
from tests.support.servers import DnsServer
from tests.support.waiting import wait_until
from worker.client import ToolClient
from worker.constants import ENQUEUED_HEADER, TENANT_LIMITS_KEY
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.protocol import task_message
from worker.queue import scheduler
from worker.queue.ages import AgeReader, QueueAges, enqueued_at
from worker.queue.leases import HOLDERS_KEY, inflight_key


def stamped(call_id: str, seconds_ago: float, batch: bool = False, header: bool = True) -> str:
    """A message as the client writes it, enqueued `seconds_ago` (in its header, and in its calls'
    `enqueuedAt`); without the header, as a producer that stamps only the calls would."""
    at = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    call = {"callId": call_id, "tool": "echo", "enqueuedAt": at.isoformat()}
    args = [[call, dict(call, callId=call_id + "-2")]] if batch else [call]
    message = json.loads(task_message(call_id, args, "toolcalls"))
    if header:
        message["headers"][ENQUEUED_HEADER] = int(at.timestamp() * 1000)
    else:
        del message["headers"][ENQUEUED_HEADER]
    return json.dumps(message)


def stock(call_id: str) -> str:
    """A stock Celery producer's message: base64 body, no enqueue stamp."""
    body = base64.b64encode(json.dumps([[{"callId": call_id, "tool": "echo"}], {}, {}]).encode()).decode()
    return json.dumps(
        {"body": body, "headers": {"task": "x", "id": call_id}, "properties": {"body_encoding": "base64"}}
    )


def by_key(rows: list) -> dict[tuple[str, str], tuple[float | None, float | None]]:
    return {(row.queue, row.tenant): (row.waiting_s, row.running_s) for row in rows}


def test_the_stamp_is_read_from_the_header_else_from_the_calls() -> None:
    """The client's header first; without it, enqueuedAt of a lone call or a batch's first call; a message
    without either gives None. A call whose arguments name `enqueuedAt` does not fool the header's reading."""
    assert enqueued_at(stamped("a", 20).encode()) == pytest.approx(time.time() - 20, abs=1)
    assert enqueued_at(stamped("a", 20, header=False).encode()) == pytest.approx(time.time() - 20, abs=1)
    assert enqueued_at(stamped("b", 5, batch=True, header=False).encode()) == pytest.approx(time.time() - 5, abs=1)
    tricky = {"callId": "t", "tool": "echo", "arguments": {ENQUEUED_HEADER: 1, "enqueuedAt": "2001-01-01T00:00:00"}}
    made = task_message("t", [tricky], "toolcalls")
    assert enqueued_at(made.encode()) == pytest.approx(time.time(), abs=2)
    assert enqueued_at(stock("c").encode()) is None
    assert enqueued_at(b"not json") is None


def test_the_oldest_waiting_call_is_the_tail_of_each_tenants_list() -> None:
    """The default tenant's oldest over its priority lists, a named tenant's from its own list; a wake-up
    item at the tail is stepped over; an empty line has no age."""
    client = fakeredis.FakeRedis()
    client.hset(TENANT_LIMITS_KEY, mapping={"alpha": "1 0 0", "beta": "1 0 0"})
    client.lpush("toolcalls", stamped("d1", 40), stamped("d2", 3))
    client.lpush("toolcalls" + scheduler.SEP + "9", stamped("p9", 70))
    client.lpush(scheduler.tenant_list("toolcalls", "alpha"), stamped("a1", 12), stamped("a2", 1))
    client.rpush(scheduler.tenant_list("toolcalls", "alpha"), scheduler.WAKE)
    ages = by_key(AgeReader(client).read(["toolcalls"]))
    assert ages[("toolcalls", "default")][0] == pytest.approx(70, abs=1)
    assert ages[("toolcalls", "alpha")][0] == pytest.approx(12, abs=1)
    assert ages[("toolcalls", "beta")] == (None, None)


def test_running_calls_are_aged_from_the_holders_in_flight_lists() -> None:
    """A tenant with calls in flight: the oldest over every live holder's in-flight list of its queue."""
    client = fakeredis.FakeRedis()
    client.sadd(HOLDERS_KEY, "h:1:a", "h:2:b")
    client.hset(scheduler.IN_FLIGHT_KEY, mapping={"gamma": 2, "default": 0})
    key = scheduler.tenant_list("toolcalls", "gamma")
    client.lpush(inflight_key("h:1:a", key), stamped("g1", 8))
    client.lpush(inflight_key("h:2:b", key), stamped("g2", 25), stamped("g3", 2))
    rows = AgeReader(client).read(["toolcalls"])
    assert by_key(rows)[("toolcalls", "gamma")][1] == pytest.approx(25, abs=1)
    assert by_key(rows)[("toolcalls", "default")] == (None, None)


def test_an_unstamped_message_ages_from_when_it_was_first_seen() -> None:
    """A stock producer's message breaks nothing: 0 at the first read, growing at the next ones."""
    client = fakeredis.FakeRedis()
    client.lpush("toolcalls", stock("s1"))
    reader = AgeReader(client)
    first = by_key(reader.read(["toolcalls"]))[("toolcalls", "default")][0]
    time.sleep(0.2)
    later = by_key(reader.read(["toolcalls"]))[("toolcalls", "default")][0]
    assert first == 0 and later is not None and later >= 0.2


def test_the_gauges_fold_unlisted_tenants_into_other() -> None:
    """Listed tenants keep their label (0 when idle); the ring's unlisted tenants are `other`, the oldest."""
    client = fakeredis.FakeRedis()
    client.hset(TENANT_LIMITS_KEY, mapping={"alpha": "1 0 0"})
    for name, age in (("x", 5), ("y", 50)):
        client.zadd(scheduler.RING_PREFIX + "toolcalls", {name: 1})
        client.lpush(scheduler.tenant_list("toolcalls", name), stamped(name, age))
    families = {family.name: family for family in QueueAges(client, ["toolcalls"]).collect()}
    samples = {s.labels["tenant"]: s.value for s in families["toolworker_queue_oldest_age_seconds"].samples}
    assert set(samples) == {"alpha", "default", "other"}
    assert samples["alpha"] == 0 and samples["default"] == 0
    assert samples["other"] == pytest.approx(50, abs=1)


@pytest.fixture(scope="module")
def capped_worker(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, dns_server: DnsServer
) -> Iterator[tuple[str, int, dict[str, str]]]:
    """A worker with its metrics served, on a Redis of its own; tenant `capped` runs one call at a time."""
    directory = tmp_path_factory.mktemp("ages-worker")
    server = EmbeddedRedis(directory / "redis").start()
    port = free_port()
    env = worker_env(server.url, upstream.url, dns_server.address, FIXTURES / "ages")
    env["TOOLWORKER_METRICS_PORT"] = str(port)
    process = start_worker(env, directory / "worker.log")
    try:
        yield server.url, port, env
    finally:
        stop_worker(process)
        server.stop()


@pytest.mark.integration
def test_a_real_worker_serves_the_ages_and_toolworker_queue_prints_them(
    capped_worker: tuple[str, int, dict[str, str]],
) -> None:
    """Three 8 s calls of a tenant capped at one in flight: the worker's /metrics shows the waiting ones'
    age and the running one's, growing; `toolworker queue --format json` shows the same ages."""
    redis_url, port, env = capped_worker
    with redis.Redis.from_url(redis_url) as r:  # the worker has written the tenants' limits: it is up
        wait_until(lambda: r.hexists(TENANT_LIMITS_KEY, "capped"), 60, "the worker's tenants")
    with ToolClient(redis_url, tenant="capped") as client:
        handles = [client.submit("slow", {"delay": 8}, timeout=60) for _ in range(3)]
        waiting = ("toolworker_queue_oldest_age_seconds", frozenset({"queue": "toolcalls", "tenant": "capped"}.items()))
        running = ("toolworker_queue_oldest_running_age_seconds", waiting[1])
        assert wait_for_sample(port, waiting, 2.0) >= 2.0
        assert wait_for_sample(port, running, 2.0) >= 2.0
        later = wait_for_sample(port, waiting, scrape(port)[waiting] + 1.0)
        assert later >= 3.0  # it grows while the calls wait
        shown = subprocess.run(
            [sys.executable, "-m", "worker", "queue", "--format", "json"], env=env, capture_output=True, text=True
        )
        assert shown.returncode == 0, shown.stderr
        row = next(r for r in json.loads(shown.stdout) if r["queue"] == "toolcalls" and r["tenant"] == "capped")
        assert row["oldest_waiting_s"] >= 2.0 and row["oldest_running_s"] >= 2.0
        assert all(handle.get(timeout=60).exit_code == 0 for handle in handles)


def test_the_gauges_take_the_oldest_over_every_shard_and_skip_one_that_is_down() -> None:
    """With shards, a tenant's calls wait on its own shard: the gauge is the oldest of them all; a shard
    that does not answer leaves the others' ages in the scrape."""
    home, other = fakeredis.FakeRedis(), fakeredis.FakeRedis()
    for client, age in ((home, 5), (other, 40)):
        client.hset(TENANT_LIMITS_KEY, mapping={"alpha": "1 0 0"})
        client.lpush(scheduler.tenant_list("toolcalls", "alpha"), stamped("a", age))
    down = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens on port 1
    families = {family.name: family for family in QueueAges([home, other, down], ["toolcalls"]).collect()}
    samples = {s.labels["tenant"]: s.value for s in families["toolworker_queue_oldest_age_seconds"].samples}
    assert samples["alpha"] == pytest.approx(40, abs=1)
