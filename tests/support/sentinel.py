"""A replicated Redis on loopback for the high-availability tests: a primary, two replicas and three
Sentinels, each a real `redis-server` process, that a test can crash, freeze and fail over; and a fleet on
it (two workers and a gateway on the Sentinel URL)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import FIXTURES, Upstream, start_worker, stop_worker, worker_env
from tests.support import waiting
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer
from worker.client import AsyncToolClient
from worker.client.replies import Replies
from worker.client.routing import Routing
from worker.dev.embedded import free_port
from worker.settings import get_settings

MASTER = "mymaster"
# Two of the Sentinels' one-second pings: at one, a single late PONG (a just-promoted replica changing role
# on a loaded machine) marked the new primary down a second after the switch, and a second failover began.
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 3000
START_TIMEOUT_S = 15.0


def redis_server_binary() -> str:
    """`redis-server` from PATH (Sentinel mode included); the tests that need it skip without it."""
    found = shutil.which("redis-server")
    if found is None:
        pytest.skip("redis-server is not on PATH")
    return found


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """tests/support/waiting.py's wait, where a server that does not answer (yet) means "not yet": the
    servers offer no event to await for role changes."""

    def holds() -> bool:
        try:
            return check()
        except (redis.RedisError, OSError):
            return False

    waiting.wait_until(holds, timeout_s, what)


@dataclass
class Node:
    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    password: str | None = None

    def client(self, timeout_s: float = 1.0) -> redis.Redis:
        return redis.Redis(
            port=self.port, password=self.password, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def pings(self) -> bool:
        with self.client() as client:
            return bool(client.ping())

    def role(self) -> str:
        with self.client() as client:
            info = client.info("replication")
        return str(info["role"])


@dataclass
class SentinelCluster:
    """Servers (index 0 starts as the primary) and Sentinels; `url` is kombu's Sentinel URL for them."""

    binary: str
    root: Path
    servers: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)
    # With replicas, a primary takes writes only while one of them is in touch (as docs/guides/high-availability.md
    # advises): one cut off by a partition, promoted past, refuses them instead of taking writes the failover will
    # discard.
    min_replicas_to_write: int = 0

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{node.port}" for node in self.sentinels) + "/0"

    def start(self, replicas: int = 2, sentinels: int = 3, sentinel_password: str | None = None) -> SentinelCluster:
        """With `sentinel_password`, the Sentinels want it (and give it to each other)."""
        self.min_replicas_to_write = min(replicas, 1)
        primary = self._start_server(Node(free_port(), self.root / "server-0"))
        for index in range(1, replicas + 1):
            self._start_server(Node(free_port(), self.root / f"server-{index}"), replica_of=primary.port)
        for index in range(sentinels):
            node = Node(free_port(), self.root / f"sentinel-{index}", password=sentinel_password)
            self._start_sentinel(node, primary.port)
        wait_until(lambda: self._sentinels_see_replicas(replicas), START_TIMEOUT_S, "Sentinels finding the replicas")
        return self

    def start_servers(self, replicas: int = 1) -> SentinelCluster:
        """A primary and replicas, no Sentinels, taking writes whatever the replicas do (a test then sees
        what a lagging replica does to takes, on the primary's own URL)."""
        primary = self._start_server(Node(free_port(), self.root / "server-0"))
        for index in range(1, replicas + 1):
            self._start_server(Node(free_port(), self.root / f"server-{index}"), replica_of=primary.port)
        return self

    def stop(self) -> None:
        for node in [*self.sentinels, *self.servers]:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)  # a frozen server cannot act on SIGKILL later
                node.process.kill()
                node.process.wait(10)

    def primary_port(self) -> int:
        """The primary's port as the Sentinels name it now (the first that answers)."""
        for node in self.sentinels:
            try:
                with node.client() as client:
                    address = client.sentinel_get_master_addr_by_name(MASTER)
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        raise RuntimeError("no Sentinel names a primary")

    def crash(self, node: Node) -> float:
        """kill -9; the monotonic time it was sent."""
        assert node.process is not None
        node.process.kill()
        killed_at = time.monotonic()
        node.process.wait(10)
        return killed_at

    def freeze(self, node: Node) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (a partition, not a crash)."""
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)

    def thaw(self, node: Node) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGCONT)

    def server(self, port: int) -> Node:
        return next(node for node in self.servers if node.port == port)

    def wait_promotion(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Until every Sentinel names another primary and that server says it is one; its port."""
        wait_until(lambda: self._all_name_other_than(old_port), timeout_s, "a promotion")
        port = self.primary_port()
        wait_until(lambda: self.server(port).role() == "master", timeout_s, "the promoted server taking writes")
        return port

    def wait_replica(self, node: Node, timeout_s: float = 30.0) -> None:
        """Until `node` replicates the current primary with its link up."""

        def replicating() -> bool:
            with node.client() as client:
                info = client.info("replication")
            return info["role"] == "slave" and info.get("master_link_status") == "up"

        wait_until(replicating, timeout_s, f"server {node.port} rejoining as a replica")

    def restart_as_replica(self, node: Node) -> None:
        """Start a crashed server again on its address, empty, as a replica of the current primary."""
        self._start_server(node, replica_of=self.primary_port(), register=False)
        self.wait_replica(node)

    def crash_over_to(self, node: Node, timeout_s: float = 30.0) -> float:
        """kill -9 of the primary with every other replica held back, so that `node` is promoted; the
        monotonic time of the kill."""
        primary = self.server(self.primary_port())
        for other in self.servers:
            if other is not node and other is not primary:
                with other.client() as client:
                    client.config_set("replica-priority", 0)
        wait_until(lambda: self._known_healthy_replica(node.port), timeout_s, "the Sentinels seeing the replica")
        killed_at = self.crash(primary)
        self.wait_promotion(primary.port, timeout_s)
        return killed_at

    def _start_server(self, node: Node, replica_of: int | None = None, register: bool = True) -> Node:
        node.directory.mkdir(parents=True, exist_ok=True)
        argv = [self.binary, "--port", str(node.port), "--bind", "127.0.0.1", "--dir", str(node.directory)]
        argv += ["--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"]
        argv += ["--repl-diskless-sync-delay", "0"]  # a replica syncs at once, not after 5 s
        argv += ["--min-replicas-to-write", str(self.min_replicas_to_write), "--min-replicas-max-lag", "2"]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        node.process = self._spawn(argv, node.directory)
        wait_until(node.pings, START_TIMEOUT_S, f"server {node.port} starting")
        if register:
            self.servers.append(node)
        if replica_of is not None:
            self.wait_replica(node)
        return node

    def _start_sentinel(self, node: Node, primary_port: int) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        config = node.directory / "sentinel.conf"  # Sentinel rewrites its file: one each
        config.write_text(
            f"port {node.port}\nbind 127.0.0.1\ndir {node.directory}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER} 2\n"
        )
        if node.password:
            config.write_text(
                config.read_text() + f"requirepass {node.password}\nsentinel sentinel-pass {node.password}\n"
            )
        node.process = self._spawn([self.binary, str(config), "--sentinel"], node.directory)
        wait_until(node.pings, START_TIMEOUT_S, f"sentinel {node.port} starting")
        self.sentinels.append(node)

    def _spawn(self, argv: list[str], directory: Path) -> subprocess.Popen[bytes]:
        with (directory / "log.txt").open("ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def _sentinels_see_replicas(self, count: int) -> bool:
        for node in self.sentinels:
            with node.client() as client:
                replicas = client.sentinel_slaves(MASTER)
                others = client.sentinel_sentinels(MASTER)
            if len(replicas) < count or len(others) < len(self.sentinels) - 1:
                return False
        return True

    def _all_name_other_than(self, old_port: int) -> bool:
        for node in self.sentinels:
            with node.client() as client:
                address = client.sentinel_get_master_addr_by_name(MASTER)
            if not address or int(address[1]) == old_port:
                return False
        return True

    def _known_healthy_replica(self, port: int) -> bool:
        with self.sentinels[0].client() as client:
            replicas = client.sentinel_slaves(MASTER)
        return any(int(r["port"]) == port and not r["is_sdown"] and r["master-link-status"] == "ok" for r in replicas)


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    """A primary, two replicas and three Sentinels (down-after 2 s), stopped after the test."""
    cluster = SentinelCluster(redis_server_binary(), tmp_path / "cluster")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


DEFINITIONS = FIXTURES / "sentinel"
LEASE_S = 2


class CountingReplies(Replies):
    """The client's reply streams, keeping every envelope they bring (a call answered twice shows here)."""

    def __init__(self, routing: Routing) -> None:
        super().__init__(routing)
        self.envelopes: defaultdict[str, list[str]] = defaultdict(list)

    def _deliver(self, envelope: dict[str, Any]) -> None:
        self.envelopes[str(envelope.get("callId"))].append(json.dumps(envelope, sort_keys=True))
        super()._deliver(envelope)


class CountingClient(AsyncToolClient):
    """The client, its replies read by CountingReplies."""

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        self.replies = CountingReplies(self.routing)
        self.envelopes = self.replies.envelopes


@dataclass
class Fleet:
    """Two workers and a gateway on the cluster's Sentinel URL."""

    cluster: SentinelCluster
    env: dict[str, str]
    logs: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateway: Gateway | None = None

    def worker_logs(self) -> str:
        return "".join(path.read_text(errors="replace") for path in self.logs.glob("worker-*.log"))


@pytest.fixture
def sentinel_fleet(
    sentinel_cluster: SentinelCluster,
    upstream: Upstream,
    dns_server: DnsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Fleet]:
    """Workers (2 s leases) and a gateway with TOOLWORKER_REDIS_MIN_REPLICAS=1, as is this test's client."""
    env = worker_env(sentinel_cluster.url, upstream.url, dns_server.address, DEFINITIONS)
    env.update(TOOLWORKER_REDIS_MIN_REPLICAS="1", TOOLWORKER_LEASE_SECONDS=str(LEASE_S))
    monkeypatch.setenv("TOOLWORKER_REDIS_MIN_REPLICAS", "1")
    get_settings.cache_clear()
    handle = Fleet(sentinel_cluster, env, tmp_path)
    try:
        handle.workers = [start_worker(env, tmp_path / f"worker-{i}.log") for i in range(2)]
        gateway_environ = gateway_env(sentinel_cluster.url, DEFINITIONS, TOOLWORKER_REDIS_MIN_REPLICAS="1")
        handle.gateway = start_gateway(gateway_environ, tmp_path / "gateway.log")
        wait_listening(handle.gateway, ready=True)
        yield handle
    finally:
        for process in handle.workers:
            stop_worker(process)
        if handle.gateway is not None:
            handle.gateway.stop()


def report(title: str, **figures: object) -> None:
    """A figure worth reading, printed (`pytest -s`)."""
    print(f"\n{title}: " + json.dumps(figures))
