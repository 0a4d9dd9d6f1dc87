"""What the operators' console costs the gateway: the fleet page at 100 tenants.

One gateway process and one worker on a fresh Redis; calls wait for 100 tenants in a queue no worker
consumes (so the fleet table has 100 tenant rows of a routed queue, and the default queue's). Signed in
once, then the fleet page (`GET /console/fleet`, one at a time) and, in the same run and on the same
gateway, `GET /v1/tools` (a REST route the gateway answers from memory) and the Redis reads behind the
page alone (`queue_rows`, what `toolworker queue --format json` runs) from this process. Figures: p50
and p90 of each, and the ratio page / REST.

    .venv/bin/python -m benchmarks.console [--requests N] [--tenants N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import redis

from benchmarks.harness import processes
from worker.client import AsyncToolClient
from worker.dev.embedded import EmbeddedRedis
from worker.queue.depth import queue_rows

TOKEN = "bench-console-token-0123456789"
TENANTS = 100
REQUESTS = 300
HELD_QUEUE = "console-bench-held"
DEFINITIONS = f"""
upstreams:
  held:
    base_url: http://127.0.0.1:9
    queue: {HELD_QUEUE}
tools:
  - name: bench_held
    upstream: held
    description: A call that waits in a queue no worker consumes.
    input_schema: {{type: object, properties: {{n: {{type: integer}}}}}}
    request: {{method: GET, path: /held}}
"""


def run(redis_url: str, requests: int = REQUESTS, tenants: int = TENANTS) -> dict[str, Any]:
    with redis.Redis.from_url(redis_url) as client:
        client.flushall()  # the other sections' tenants would be rows too
    with tempfile.TemporaryDirectory() as tmp:
        definitions = Path(tmp) / "definitions"
        definitions.mkdir()
        (definitions / "tools.yaml").write_text(DEFINITIONS)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
        env |= {"TOOLWORKER_REDIS_URL": redis_url, "TOOLWORKER_DEFINITIONS": str(definitions)}
        subprocess.run([sys.executable, "-m", "worker", "publish"], env=env, check=True, capture_output=True)
        worker_argv = [sys.executable, "-m", "worker", "worker", "-n", "bench-console@%h"]
        with (
            processes.process_group(worker_argv, env | {"TOOLWORKER_METRICS_PORT": "0"}, Path(tmp) / "worker.log"),
            processes.gateway(redis_url, definitions, TOOLWORKER_GATEWAY_TOKENS=TOKEN) as (url, _pid),
        ):
            asyncio.run(_enqueue(redis_url, tenants))
            return _measure(url, redis_url, requests, tenants)


async def _enqueue(redis_url: str, tenants: int) -> None:
    client = AsyncToolClient(redis_url)
    try:
        for n in range(tenants):
            await client.submit_many([("bench_held", {"n": n}, {})], timeout=3600, tenant=f"tenant-{n:03d}")
    finally:
        await client.aclose()


def _measure(url: str, redis_url: str, requests: int, tenants: int) -> dict[str, Any]:
    with httpx2.Client(base_url=url, timeout=30) as http:
        form = http.get("/console/login").text
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
        assert csrf is not None
        signed = http.post(
            "/console/login", data={"csrf_token": csrf.group(1), "token": TOKEN}, headers={"Origin": url}
        )
        assert signed.status_code == 303, signed.text
        first = http.get("/console/fleet").text  # the first page waits for the workers' ping
        rows = first.count("<tr><td>")
        page = _timed(lambda: http.get("/console/fleet"), requests)
        rest = _timed(lambda: http.get("/v1/tools", headers={"Authorization": f"Bearer {TOKEN}"}), requests)
    client = redis.Redis.from_url(redis_url)
    try:
        reads = _timed(lambda: queue_rows(client), requests)
    finally:
        client.close()
    return {
        "tenants": tenants,
        "requests": requests,
        "table_rows": rows,
        "fleet_page": page,
        "rest_tools": rest,
        "queue_rows": reads,
        "page_over_rest": round(page["p50_ms"] / rest["p50_ms"], 2),
    }


def _timed(action: Any, requests: int) -> dict[str, float]:
    action()
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        action()
        latencies.append((time.perf_counter() - started) * 1000)
    latencies.sort()
    return {"p50_ms": round(statistics.median(latencies), 2), "p90_ms": round(latencies[int(len(latencies) * 0.9)], 2)}


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\nconsole: the fleet page at {results['tenants']} tenants ({results['table_rows']} rows shown), "
        f"{results['requests']} requests one at a time"
    )
    for name, key in (
        ("GET /console/fleet", "fleet_page"),
        ("GET /v1/tools (REST)", "rest_tools"),
        ("queue_rows (Redis reads)", "queue_rows"),
    ):
        figures = results[key]
        print(f"  {name:<28} p50 {figures['p50_ms']:>7.2f} ms   p90 {figures['p90_ms']:>7.2f} ms")
    print(f"  fleet page p50 / REST p50: {results['page_over_rest']}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--tenants", type=int, default=TENANTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            print_section(run(server.url, args.requests, args.tenants))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
