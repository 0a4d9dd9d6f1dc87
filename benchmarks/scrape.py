"""What a scrape of a worker's queue gauges costs Redis: 100 tenants, 10,000 calls waiting.

    .venv/bin/python -m benchmarks.scrape [--tenants 100] [--waiting 10000] [--holders 4] [--scrapes 50]

On a Redis-compatible server of its own: `tenants` tenants listed in the limits (as the definitions write
them), `waiting` calls spread evenly over their lists of `toolcalls` (one message each, as the client
writes them, `enqueuedAt` stamped), and `holders` live workers each holding one running call of every
tenant (in-flight lists, the in-flight count). Then `scrapes` scrapes of what a worker's /metrics reads for
the queue: the depth collector (worker/queue/depth.py) and the age collector (worker/queue/ages.py), each
alone and both. Per scrape: Redis commands (`INFO commandstats`, those inside scripts too), round trips
(pipelines count once), Redis main-thread CPU (`used_cpu_*_main_thread`), and the scrape's wall time
from this process (median, p90).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.meter import Counters
from worker.constants import DEFAULT_QUEUE, TENANT_LIMITS_KEY
from worker.dev.embedded import EmbeddedRedis
from worker.protocol import task_message
from worker.queue import scheduler
from worker.queue.ages import QueueAges
from worker.queue.depth import QueueDepth
from worker.queue.leases import HOLDERS_KEY, LEASE_PREFIX, inflight_key


def fill(client: redis.Redis, tenants: int, waiting: int, holders: int) -> None:
    """The tenants, their waiting calls (oldest a minute ago) and each holder's running call of each."""
    names = [f"tenant-{n:03d}" for n in range(tenants)]
    client.hset(TENANT_LIMITS_KEY, mapping=dict.fromkeys(names, "1 0 0"))
    start = datetime.now(UTC) - timedelta(seconds=60)
    for index, name in enumerate(names):
        count = waiting // tenants + (index < waiting % tenants)
        messages = [_message(f"{name}-{i}", start + timedelta(milliseconds=i)) for i in range(count)]
        with client.pipeline(transaction=False) as pipe:
            scheduler.enqueue(pipe, DEFAULT_QUEUE, name, messages, len(messages))
            pipe.execute()
    for number in range(holders):
        holder = f"bench-host:{number}:0000"
        client.sadd(HOLDERS_KEY, holder)
        client.set(LEASE_PREFIX + holder, "1")
        for name in names:
            client.lpush(inflight_key(holder, scheduler.tenant_list(DEFAULT_QUEUE, name)), _message(name, start))
            client.hincrby(scheduler.IN_FLIGHT_KEY, name, 1)


def _message(call_id: str, at: datetime) -> str:
    call = {"callId": call_id, "tool": "echo", "arguments": {"item": "x" * 200}, "enqueuedAt": at.isoformat()}
    return task_message(call_id, [call], DEFAULT_QUEUE)


def measure(redis_url: str, scrape: Callable[[], Any], scrapes: int) -> dict[str, float]:
    """Commands, main-thread CPU and wall time per scrape."""
    counters = Counters(redis_url)
    walls = []
    try:
        with counters.during() as counted:
            for _ in range(scrapes):
                started = time.perf_counter()
                scrape()
                walls.append(time.perf_counter() - started)
    finally:
        counters.close()
    walls.sort()
    return {
        "commands": counted["commands"] / scrapes,
        "main_thread_ms": counted["main_thread_s"] * 1000 / scrapes,
        "p50_ms": statistics.median(walls) * 1000,
        "p90_ms": walls[int(len(walls) * 0.9)] * 1000,
    }


def run(tenants: int, waiting: int, holders: int, scrapes: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as directory:
        server = EmbeddedRedis(Path(directory)).start()
        try:
            client = redis.Redis.from_url(server.url)
            fill(client, tenants, waiting, holders)
            depth, ages = QueueDepth(client, [DEFAULT_QUEUE]), QueueAges(client, [DEFAULT_QUEUE])
            shapes: dict[str, Callable[[], Any]] = {
                "depth (queue_depth, in_flight, per tenant)": lambda: list(depth.collect()),
                "ages (oldest waiting, oldest running)": lambda: list(ages.collect()),
                "both (a worker's /metrics)": lambda: (list(depth.collect()), list(ages.collect())),
            }
            for scrape in shapes.values():
                scrape()  # scripts cached, connections open
            return {name: measure(server.url, scrape, scrapes) for name, scrape in shapes.items()}
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--holders", type=int, default=4)
    parser.add_argument("--scrapes", type=int, default=50)
    args = parser.parse_args(argv)
    results = run(args.tenants, args.waiting, args.holders, args.scrapes)
    print(
        f"a scrape's cost: {args.tenants} tenants, {args.waiting} calls waiting, {args.holders} holders each "
        f"running a call of every tenant; {args.scrapes} scrapes"
    )
    print(f"  {'what':<44} {'cmds/scrape':>11} {'Redis main ms':>13} {'p50 ms':>7} {'p90 ms':>7}")
    for name, figures in results.items():
        print(
            f"  {name:<44} {figures['commands']:>11.0f} {figures['main_thread_ms']:>13.2f} "
            f"{figures['p50_ms']:>7.2f} {figures['p90_ms']:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
