"""Bulkheads and poison messages: a slow upstream's own queue cannot starve the others; messages that
are not calls are dead-lettered while the worker keeps consuming."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import FIXTURES, Upstream, start_worker, stop_worker, worker_env
from tests.support.servers import DnsServer
from tests.support.waiting import scaled, wait_until
from worker.client import AsyncToolClient
from worker.constants import DEAD_LETTER_KEY, DEFAULT_QUEUE, ROUTES_KEY
from worker.dev.embedded import EmbeddedRedis

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path: Path, upstream: Upstream, dns_server: DnsServer) -> Iterator[tuple[str, dict[str, str]]]:
    """A Redis server of its own and a worker that consumes only the default queue."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    env = worker_env(server.url, upstream.url, dns_server.address, FIXTURES / "bulkheads")
    process = start_worker(env, tmp_path / "default.log", "-Q", DEFAULT_QUEUE)
    yield server.url, env
    stop_worker(process)
    server.stop()


async def _call(url: str, tool: str, arguments: dict[str, float], timeout: float) -> int:
    client = AsyncToolClient(url)
    try:
        return (await client.acall(tool, arguments, timeout=timeout)).exit_code
    finally:
        await client.aclose()


def test_slow_upstream_has_its_own_queue(stack: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    """Calls to a queued upstream wait on that queue while other tools are served; its own worker drains it."""
    url, env = stack
    r = redis.Redis.from_url(url)
    wait_until(lambda: r.hget(ROUTES_KEY, "slow_call") == b"slowlane", what="the routes written")

    async def scenario() -> tuple[list[int], int, float]:
        slow = [asyncio.create_task(_call(url, "slow_call", {"delay": 0.1}, scaled(30))) for _ in range(5)]
        started = time.monotonic()
        fast = await _call(url, "fast_echo", {}, scaled(10))
        fast_s = time.monotonic() - started
        assert r.llen("slowlane") >= 1  # nobody consumes the slow lane yet
        lane = start_worker(env, tmp_path / "slowlane.log", "-Q", "slowlane")
        try:
            return list(await asyncio.gather(*slow)), fast, fast_s
        finally:
            stop_worker(lane)

    slow_codes, fast_code, fast_s = asyncio.run(scenario())
    assert fast_code == 0 and fast_s < scaled(5)
    assert slow_codes == [0] * 5
    r.close()


def test_poison_messages_are_dead_lettered(stack: tuple[str, dict[str, str]]) -> None:
    """Undecodable and unknown-task messages land in the dead-letter list with a reason; calls go on."""
    url, _ = stack
    r = redis.Redis.from_url(url)
    undecodable = {
        "body": "{not json",
        "content-type": "application/json",
        "content-encoding": "utf-8",
        "headers": {"lang": "py", "task": "toolcall.execute", "id": "p-1"},
        "properties": {"delivery_tag": "p-1", "delivery_info": {"exchange": "", "routing_key": "toolcalls"}},
    }
    unknown = {
        **undecodable,
        "body": json.dumps([[{"tool": "x", "headers": {"X-Secret": "hide-me-123"}}], {}, {}]),
        "headers": {"lang": "py", "task": "not.a.task", "id": "p-2"},
        "properties": {"delivery_tag": "p-2", "delivery_info": {"exchange": "", "routing_key": "toolcalls"}},
    }
    r.lpush(DEFAULT_QUEUE, json.dumps(undecodable), json.dumps(unknown))
    wait_until(lambda: r.llen(DEAD_LETTER_KEY) == 2, what="two dead letters")
    entries = [json.loads(e) for e in r.lrange(DEAD_LETTER_KEY, 0, -1)]
    reasons = sorted(e["reason"] for e in entries)
    assert reasons == ["undecodable message", "unknown task 'not.a.task'"]
    assert "hide-me-123" not in json.dumps(entries)
    assert asyncio.run(_call(url, "fast_echo", {}, 10)) == 0
    r.close()
