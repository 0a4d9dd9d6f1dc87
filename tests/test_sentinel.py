"""High availability (SPEC §7): Redis Sentinel everywhere, leases that take no failover for dead workers,
durable enqueue with TOOLWORKER_REDIS_MIN_REPLICAS, and clear errors for bad Sentinel settings.

Real processes on loopback: a primary, two replicas and three Sentinels (tests/support/sentinel.py), two
workers and a gateway on the Sentinel URL, and the local upstream. Figures worth reading are printed (`-s`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tests.conftest import Upstream
from tests.support.sentinel import (
    DEFINITIONS,
    LEASE_S,
    CountingClient,
    Fleet,
    SentinelCluster,
    redis_server_binary,
    report,
    wait_until,
)
from worker.client import AsyncToolClient
from worker.connections import async_client, parse_sentinel_url, sync_client
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.queue.leases import LEASE_PREFIX, Leases, inflight_key
from worker.settings import get_settings


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_lease_sweep_hands_back_no_live_workers_calls(sentinel_fleet: Fleet, upstream: Upstream) -> None:
    """Calls that run across a failover longer than a lease (2 s) are sent upstream once each and answered once:
    no worker takes the other's leases for dead."""
    cluster, tag = sentinel_fleet.cluster, uuid.uuid4().hex[:8]
    items = [f"{tag}-{n}" for n in range(8)]

    async def scenario() -> tuple[list[int], Counter[str]]:
        client = CountingClient(cluster.url)
        try:
            ids = await client.submit_many([("slow_get", {"item": i, "delay": 6}) for i in items], timeout=120)
            wait_running = lambda: sum(f"item={i}" in path for _, path in upstream.state.hits for i in items) == 8  # noqa: E731
            await asyncio.to_thread(wait_until, wait_running, 30, "every slow call reaching the upstream")
            old = cluster.primary_port()
            await asyncio.to_thread(cluster.crash, cluster.server(old))
            await asyncio.to_thread(cluster.wait_promotion, old)
            results = await asyncio.gather(*(client.result(call_id, 120) for call_id in ids))
            await asyncio.sleep(3 * LEASE_S)  # sweeps after the grace would hand a held call out again now
            return [r.exit_code for r in results], Counter({c: len(client.envelopes[c]) for c in ids})
        finally:
            await client.aclose()

    exit_codes, envelopes = asyncio.run(scenario())
    sent = Counter(i for _, path in upstream.state.hits for i in items if f"item={i}" in path)
    report("slow calls across a failover", sent=dict(sent), envelopes=sorted(envelopes.values()))
    assert exit_codes == [0] * len(items)
    assert sorted(sent.values()) == [1] * len(items) and sorted(envelopes.values()) == [1] * len(items)
    assert '"lease.recovered"' not in sentinel_fleet.worker_logs()


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_sweeper_judges_no_lease_on_a_just_promoted_primary(
    sentinel_cluster: SentinelCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failover longer than a lease, a sweeper (even one started after it) hands back nothing within the
    grace, and after it only the messages of the holder that never renewed."""
    monkeypatch.setenv("TOOLWORKER_REDIS_URL", sentinel_cluster.url)
    get_settings.cache_clear()
    client = sync_client(sentinel_cluster.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    live, gone = (Leases(client, 1, "unacked", "unacked_index") for _ in range(2))
    try:
        for holder in (live, gone):
            holder.renew()
            client.lpush(inflight_key(holder.holder, "q"), json.dumps({"properties": {"delivery_tag": holder.holder}}))
        old = sentinel_cluster.primary_port()
        sentinel_cluster.crash(sentinel_cluster.server(old))
        sentinel_cluster.wait_promotion(old)
        wait_until(lambda: not client.exists(LEASE_PREFIX + live.holder), 10, "the leases lapsing on the new primary")
        sweeper = Leases(client, 1, "unacked", "unacked_index")  # a worker started after the failover
        sweeper.tick()
        handed_back_in_grace = client.llen("q")
        # The live holder is back within the grace, and renews from then on.
        wait_until(lambda: live.renew() or sweeper.renew() or sweeper.may_sweep(), 30, "the grace passing")
        live.renew()
        sweeper.tick()
        queued = [json.loads(raw)["properties"]["delivery_tag"] for raw in client.lrange("q", 0, -1)]
    finally:
        client.close()
    assert handed_back_in_grace == 0
    assert queued == [gone.holder]


def toolworker(url: str, *argv: str, **extra: str) -> tuple[int, str]:
    """Run the CLI against `url`; its exit code and standard error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
    env.update(TOOLWORKER_REDIS_URL=url, TOOLWORKER_METRICS_PORT="0", TOOLWORKER_DEFINITIONS=str(DEFINITIONS), **extra)
    done = subprocess.run([sys.executable, "-m", "worker", *argv], env=env, capture_output=True, timeout=60)
    return done.returncode, done.stderr.decode()


@pytest.mark.integration
@pytest.mark.parametrize("command", [["worker"], ["call", "echo_get", "--arg", "item=1"], ["publish"]])
def test_no_reachable_sentinel_exits_69_saying_so(command: list[str]) -> None:
    """A Sentinel URL where no Sentinel listens ends the command with 69 and names the Sentinels it tried."""
    ports = [free_port(), free_port()]
    code, stderr = toolworker(";".join(f"sentinel://:pw-0417@127.0.0.1:{p}" for p in ports) + "/0", *command)
    reason = stderr.strip().splitlines()[-1]
    assert code == 69, stderr
    assert reason.startswith(f"toolworker: cannot reach any Sentinel at 127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]}")
    assert "pw-0417" not in stderr


@pytest.mark.integration
@pytest.mark.parametrize("command", [["worker"], ["call", "echo_get", "--arg", "item=1"]])
def test_an_unknown_master_name_exits_69_saying_so(sentinel_cluster: SentinelCluster, command: list[str]) -> None:
    """Sentinels that know no master of the configured name end the command with 69 and say which name."""
    code, stderr = toolworker(sentinel_cluster.url, *command, TOOLWORKER_REDIS_SENTINEL_MASTER="not-ours")
    assert code == 69, stderr
    assert "knows a master named 'not-ours'" in stderr.strip().splitlines()[-1]


@pytest.mark.integration
def test_a_wrong_sentinel_password_exits_69_saying_so(tmp_path: Path) -> None:
    """A Sentinel password the Sentinels do not take ends the command with 69, "authentication failed", masked."""
    cluster = SentinelCluster(redis_server_binary(), tmp_path / "cluster")
    try:
        cluster.start(replicas=0, sentinels=1, sentinel_password="right-pw-0417")
        code, stderr = toolworker(cluster.url, "worker", TOOLWORKER_REDIS_SENTINEL_PASSWORD="wrong-pw-0417")
    finally:
        cluster.stop()
    assert code == 69, stderr
    assert "authentication failed at the Sentinels" in stderr and "wrong-pw-0417" not in stderr


@pytest.mark.integration
def test_an_enqueue_no_replica_confirms_raises(redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """With TOOLWORKER_REDIS_MIN_REPLICAS=1 and a server without replicas, submitting raises and says why."""
    monkeypatch.setenv("TOOLWORKER_REDIS_MIN_REPLICAS", "1")
    monkeypatch.setenv("TOOLWORKER_REDIS_MIN_REPLICAS_TIMEOUT_SECONDS", "0.2")
    get_settings.cache_clear()

    async def submit() -> None:
        client = AsyncToolClient(redis_server.url, queue=f"unserved-{uuid.uuid4().hex}")
        try:
            await client.submit_many([("echo_get", {"item": "1"})])
        finally:
            await client.aclose()

    with pytest.raises(RedisError, match=r"only 0 of 1 replicas confirmed it within 0\.2 s"):
        asyncio.run(submit())


def test_a_sentinel_url_is_read_as_kombu_reads_it() -> None:
    """Every `;`-separated Sentinel, default port 26379; the primary's password and db from the URL."""
    parsed = parse_sentinel_url("sentinel://:pri%2Fpw@10.0.0.1:26380;sentinel://10.0.0.2/3")
    assert parsed.nodes == (("10.0.0.1", 26380), ("10.0.0.2", 26379))
    assert (parsed.db, parsed.password, parsed.username) == (3, "pri/pw", None)


@pytest.mark.parametrize("url", ["sentinel://h:1;redis://:pw-0417@h:2/0", "sentinel://:pw-0417@h:1/zero"])
def test_a_malformed_sentinel_url_is_refused_with_the_password_masked(url: str) -> None:
    """A part that is not a Sentinel address, or a db that is not a number, is a ValueError, password masked."""
    with pytest.raises(ValueError) as raised:
        parse_sentinel_url(url)
    assert "pw-0417" not in str(raised.value) and "***" in str(raised.value)


@pytest.mark.integration
def test_a_primary_that_refuses_writes_for_want_of_replicas_is_left_like_a_demoted_one(
    sentinel_cluster: SentinelCluster,
) -> None:
    """NOREPLICAS from the server the Sentinels name (a primary cut off from its replicas, promoted past) fails
    as a connection error, which the caller's retries follow through the Sentinels, as they do READONLY."""
    primary = sentinel_cluster.server(sentinel_cluster.primary_port())
    with primary.client() as admin:
        admin.config_set("min-replicas-to-write", 3)  # more than it has: every write is refused
    client = sync_client(sentinel_cluster.url, retry=None, socket_timeout=2.0)

    async def async_write() -> None:
        async_redis = async_client(sentinel_cluster.url, retry=None, socket_timeout=2.0)
        try:
            await async_redis.set("k", "v")
        finally:
            await async_redis.aclose()

    try:
        assert client.get("k") is None  # reads go on
        with pytest.raises(RedisConnectionError, match="the primary refuses writes: NOREPLICAS"):
            client.set("k", "v")
        with pytest.raises(RedisConnectionError, match="the primary refuses writes: NOREPLICAS"):
            asyncio.run(async_write())
    finally:
        client.close()
