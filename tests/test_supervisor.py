"""`toolworker worker --processes N`: children share the queue and one metrics port, and come back when killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, Upstream, start_worker, wait_ready, worker_env
from tests.support.prometheus import wait_for_sample
from tests.support.servers import DnsServer
from tests.support.waiting import scaled, wait_until
from worker.client import AsyncToolClient
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.queue.supervisor import child_hostname


def test_child_hostnames() -> None:
    assert child_hostname(None, 0) == "toolworker-0@%h"
    assert child_hostname("api@%h", 1) == "api-1@%h"
    assert child_hostname("api", 2) == "api-2@%h"


def children_of(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False)
    return {int(line) for line in out.stdout.split()}


async def slow_calls(redis_url: str, count: int) -> list[int]:
    """`count` calls of half a second, each its own message, so both processes get some."""
    client = AsyncToolClient(redis_url, max_batch=1)
    try:
        results = await asyncio.gather(*(client.acall("slow", {"delay": 0.5}, timeout=60) for _ in range(count)))
    finally:
        await client.aclose()
    return [r.exit_code for r in results]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_two_processes_share_the_work_and_one_metrics_port(
    tmp_path: Path, upstream: Upstream, dns_server: DnsServer
) -> None:
    redis = EmbeddedRedis(tmp_path / "redis").start()
    port, metrics_dir = free_port(), tmp_path / "metrics"
    env = worker_env(redis.url, upstream.url, dns_server.address, FIXTURES / "integration")
    env |= {"TOOLWORKER_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    process = start_worker(env, tmp_path / "worker.log", "--processes", "2")
    try:
        wait_until(lambda: len(children_of(process.pid)) == 2, 30, "two worker processes")
        wait_ready(process, tmp_path / "worker.log", processes=2)  # both take, not the first one ready alone
        first = children_of(process.pid)
        assert asyncio.run(slow_calls(redis.url, 32)) == [0] * 32
        # Each process keeps its metrics in files named by its pid; the supervisor's port adds them up.
        writers = {int(p.stem.rpartition("_")[2]) for p in metrics_dir.glob("counter_*.db")}
        assert writers == first
        calls = ("toolworker_calls_total", frozenset({"tool": "slow", "upstream": "local", "exit_code": "0"}.items()))
        assert wait_for_sample(port, calls, 32) == 32

        killed = min(first)
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: len(children_of(process.pid) - {killed}) == 2, 30, "a new worker process")
        assert asyncio.run(slow_calls(redis.url, 4)) == [0] * 4
    finally:
        process.terminate()
        code = process.wait(scaled(30))
        redis.stop()
    assert code == 0
    assert children_of(process.pid) == set()
