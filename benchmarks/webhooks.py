"""What a webhook delivery costs a worker: CPU per delivery and deliveries/s, against a local receiver.

Two measures, each on one worker process with callbacks on (TOOLWORKER_CALLBACK_ALLOW, two signing
secrets: a key rotation, the dearer case), against the benchmark upstream as the receiver (0 ms, a small
2xx body):

- deliveries alone: N delivery records written into Redis as the publisher writes them, all due at
  once; the worker's CPU time until the due set is empty, per delivery, and deliveries/s;
- calls with and without a callback: the same burst of calls (`AsyncToolClient.acall`), with
  `callback_url=` and without; the worker's CPU per call until every delivery is made, and the difference,
  in the same round. Configurations take turns round after round; each figure is the median of its rounds.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import sys
import time
import uuid
from typing import Any

import redis

from benchmarks.harness import processes
from benchmarks.harness.constants import CALL_TIMEOUT_S, RAW_CONCURRENCY, TOOL
from benchmarks.harness.meter import Meter
from worker.client import AsyncToolClient
from worker.queue.webhooks import DUE_KEY, record_key, webhook_id
from worker.settings import get_settings

RECEIVER_BODY_BYTES = 64
SECRETS = " ".join("whsec_" + base64.b64encode(f"benchmark key {i:018d}".encode()).decode() for i in range(2))
DRAIN_TIMEOUT_S = 600.0
WITHOUT = "calls without a callback"
WITH = "calls with a callback"


def env_for(receiver_url: str) -> dict[str, str]:
    port = receiver_url.rsplit(":", 1)[1]
    return {"TOOLWORKER_CALLBACK_ALLOW": f"127.0.0.1:{port}", "TOOLWORKER_CALLBACK_SECRET": SECRETS}


def run(redis_url: str, calls: int, rounds: int) -> dict[str, Any]:
    """Both measures, `rounds` times each; medians."""
    alone: list[dict[str, float]] = []
    paired: dict[str, list[float]] = {WITHOUT: [], WITH: []}
    with processes.upstream(0.0, RECEIVER_BODY_BYTES) as receiver:
        env = env_for(receiver.url)
        os.environ["TOOLWORKER_CALLBACK_ALLOW"] = env["TOOLWORKER_CALLBACK_ALLOW"]  # the client checks it too
        get_settings.cache_clear()
        with processes.toolworker(redis_url, receiver.url, 64, RAW_CONCURRENCY, extra_env=env) as pid:
            for number in range(rounds):
                alone.append(_deliveries_alone(redis_url, pid, receiver.url, calls))
                order = [WITHOUT, WITH] if number % 2 == 0 else [WITH, WITHOUT]
                for case in order:
                    callback = f"{receiver.url}/hook" if case == WITH else None
                    paired[case].append(_calls(redis_url, pid, calls, callback))
                print(
                    f"  webhooks: round {number + 1}: {alone[-1]['cpu_ms_per_delivery']:.3f} ms CPU/delivery, "
                    f"{alone[-1]['deliveries_per_s']:.0f}/s",
                    file=sys.stderr,
                )
    return _summary(calls, rounds, alone, paired)


def _deliveries_alone(redis_url: str, pid: int, receiver_url: str, count: int) -> dict[str, float]:
    client = redis.Redis.from_url(redis_url)
    body = b'{"callId": "x", "exitCode": 0, "result": "' + b"r" * 800 + b'"}'
    now_ms = int(time.time() * 1000)
    try:
        with Meter(pid) as meter:
            started = time.perf_counter()
            with client.pipeline(transaction=False) as pipe:
                for _ in range(count):
                    call_id = str(uuid.uuid4())
                    fields = {"url": f"{receiver_url}/hook", "id": webhook_id(call_id), "body": body}
                    pipe.hset(record_key(call_id), mapping={**fields, "first": now_ms, "attempts": 0})
                    pipe.zadd(DUE_KEY, {call_id: now_ms})
                pipe.execute()
            _drained(client)
            seconds = time.perf_counter() - started
    finally:
        client.close()
    return {"cpu_ms_per_delivery": meter.cpu_s * 1000 / count, "deliveries_per_s": count / seconds}


def _calls(redis_url: str, pid: int, count: int, callback: str | None) -> float:
    """The worker's CPU ms per call for a burst, every delivery made."""
    client = redis.Redis.from_url(redis_url)
    try:
        with Meter(pid) as meter:
            failures = asyncio.run(_burst(redis_url, count, callback))
            _drained(client)
    finally:
        client.close()
    if failures:
        raise RuntimeError(f"{failures} calls failed")
    return meter.cpu_s * 1000 / count


async def _burst(redis_url: str, count: int, callback: str | None) -> int:
    client = AsyncToolClient(redis_url)
    try:
        results = await asyncio.gather(
            *(client.acall(TOOL, {"i": i}, timeout=CALL_TIMEOUT_S, callback_url=callback) for i in range(count))
        )
    finally:
        await client.aclose()
    return sum(1 for result in results if result.exit_code)


def _drained(client: redis.Redis) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while client.zcard(DUE_KEY):
        if time.monotonic() > deadline:
            raise RuntimeError("the deliveries were not all made in time")
        time.sleep(0.01)


def _summary(calls: int, rounds: int, alone: list[dict[str, float]], paired: dict[str, list[float]]) -> dict[str, Any]:
    without, with_ = statistics.median(paired[WITHOUT]), statistics.median(paired[WITH])
    return {
        "calls": calls,
        "rounds": rounds,
        "cpu_ms_per_delivery": round(statistics.median(r["cpu_ms_per_delivery"] for r in alone), 4),
        "deliveries_per_s": round(statistics.median(r["deliveries_per_s"] for r in alone), 1),
        "cpu_ms_per_call_without": round(without, 4),
        "cpu_ms_per_call_with": round(with_, 4),
        "added_cpu_ms_per_call": round(with_ - without, 4),
        "cpu_ratio": round(with_ / without, 3),
        "each_round": {"alone": alone, **paired},
    }


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\nwebhooks: one worker process, receiver 0 ms, two signing secrets; {results['calls']} a round, "
        f"medians of {results['rounds']} rounds"
    )
    print(
        f"  deliveries alone: {results['cpu_ms_per_delivery']:.3f} ms worker CPU per delivery, "
        f"{results['deliveries_per_s']:.0f} deliveries/s"
    )
    print(
        f"  calls: {results['cpu_ms_per_call_without']:.3f} ms CPU/call without a callback, "
        f"{results['cpu_ms_per_call_with']:.3f} with (+{results['added_cpu_ms_per_call']:.3f} ms, "
        f"ratio {results['cpu_ratio']:.2f})"
    )
