"""What TOOLWORKER_REDIS_MIN_REPLICAS=1 costs: each enqueue, each take and each published result waits (WAIT)
until a replica has it.

A primary and one replica of its own (`redis-server --replicaof`, on 127.0.0.1), one upstream (0 ms, 1 KB)
and one worker process per configuration; the client in this process. For each configuration: a burst of
calls through `AsyncToolClient` (calls/s) and calls one at a time through `ToolClient` (p50 latency). The
configurations take turns, round after round; each figure is the median of its rounds, and the ratios are
of MIN_REPLICAS=0 in the same run.

    .venv/bin/python -m benchmarks.run --replicas-only
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness import processes
from benchmarks.harness.constants import RAW_CONCURRENCY, UPSTREAM_BODY_BYTES, UPSTREAM_LATENCY_MS
from benchmarks.harness.load import async_burst, single_sequential
from worker.dev.embedded import free_port, server_binary
from worker.settings import get_settings

CONFIGURATIONS = {"MIN_REPLICAS=0 (reference)": 0, "MIN_REPLICAS=1": 1}


@contextmanager
def replicated_redis() -> Iterator[str]:
    """A primary and a replica in a temporary directory; yields the primary's URL."""
    with tempfile.TemporaryDirectory() as tmp:
        primary, replica = free_port(), free_port()
        processes = [_server(Path(tmp) / "primary", primary), _server(Path(tmp) / "replica", replica, primary)]
        try:
            _wait_replicating(primary)
            yield f"redis://127.0.0.1:{primary}/0"
        finally:
            for process in processes:
                process.terminate()
                process.wait(10)


def _server(directory: Path, port: int, replica_of: int | None = None) -> subprocess.Popen[bytes]:
    directory.mkdir(parents=True)
    argv = [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", ""]
    argv += ["--appendonly", "no", "--repl-diskless-sync-delay", "0"]
    if replica_of is not None:
        argv += ["--replicaof", "127.0.0.1", str(replica_of)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


def _wait_replicating(primary: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    client = redis.Redis(port=primary, socket_connect_timeout=1)
    try:
        while True:
            try:
                if client.info("replication").get("connected_slaves") == 1:
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not connect")
            time.sleep(0.05)
    finally:
        client.close()


def run(calls: int, light_calls: int, rounds: int) -> dict[str, Any]:
    """Each configuration once per round, in turn; the medians and their ratios to MIN_REPLICAS=0."""
    measured: dict[str, list[dict[str, float]]] = {}
    names = list(CONFIGURATIONS)
    with replicated_redis() as url, processes.upstream(UPSTREAM_LATENCY_MS, UPSTREAM_BODY_BYTES) as upstream:
        for number in range(rounds):
            for name in names[number % len(names) :] + names[: number % len(names)]:
                figures = _measure(url, upstream.url, calls, light_calls, CONFIGURATIONS[name])
                measured.setdefault(name, []).append(figures)
                print(f"  replicas: {name}: {figures['calls_per_s']:.0f} calls/s", file=sys.stderr)
    return {"calls": calls, "light_calls": light_calls, "rounds": rounds, "rows": _rows(measured)}


def _measure(url: str, upstream_url: str, calls: int, light_calls: int, min_replicas: int) -> dict[str, float]:
    env = {"TOOLWORKER_REDIS_MIN_REPLICAS": str(min_replicas)}
    os.environ.update(env)  # the client in this process reads it from its settings
    get_settings.cache_clear()
    try:
        with processes.toolworker(url, upstream_url, 64, RAW_CONCURRENCY, extra_env=env):
            burst = async_burst(url, calls, 1)
            light = single_sequential(url, light_calls)
    finally:
        os.environ.pop("TOOLWORKER_REDIS_MIN_REPLICAS")
        get_settings.cache_clear()
    return {
        "calls_per_s": calls / burst.seconds,
        "light_p50_ms": statistics.median(light.latencies_s) * 1000,
        "failures": float(sum(burst.failures.values()) + sum(light.failures.values())),
    }


def _rows(measured: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in measured.items()}
    reference = medians[next(iter(CONFIGURATIONS))]
    return [
        {
            "case": name,
            "calls_per_s": round(m["calls_per_s"], 1),
            "calls_per_s_ratio": round(m["calls_per_s"] / reference["calls_per_s"], 3),
            "light_p50_ms": round(m["light_p50_ms"], 3),
            "light_p50_ratio": round(m["light_p50_ms"] / reference["light_p50_ms"], 3),
            "failures": int(sum(r["failures"] for r in measured[name])),
        }
        for name, m in medians.items()
    ]


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\nreplicas: a primary and one replica; upstream {UPSTREAM_LATENCY_MS:g} ms, 1 KB; one worker process; "
        f"{results['calls']} calls a burst, {results['light_calls']} one at a time; medians of {results['rounds']} "
        "rounds; ratios of MIN_REPLICAS=0"
    )
    print(f"  {'case':<28} {'calls/s':>8} {'ratio':>6} {'light p50 ms':>13} {'ratio':>6} {'fail':>5}")
    for row in results["rows"]:
        print(
            f"  {row['case']:<28} {row['calls_per_s']:>8.0f} {row['calls_per_s_ratio']:>6.3f}"
            f" {row['light_p50_ms']:>13.3f} {row['light_p50_ratio']:>6.3f} {row['failures']:>5}"
        )
