"""Memory under load: the worker's RSS with many calls in flight at a slow upstream, and with huge upstream
bodies cut at max_response_bytes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from typing import Any

from benchmarks.harness import processes
from benchmarks.harness.constants import KB, RAW_CONCURRENCY, Sizes
from benchmarks.harness.figures import Target, size_label
from benchmarks.harness.load import async_burst
from benchmarks.harness.meter import Meter, Sample, rss_mb
from worker.constants import DEFAULT_MAX_RESPONSE_BYTES
from worker.dev.embedded import EmbeddedRedis

MAX_RSS_MB = 150.0
MIN_IN_FLIGHT = 1000
BIG_BODY_LATENCY_MS = 100.0


def run(server: EmbeddedRedis, sizes: Sizes, args: argparse.Namespace) -> dict[str, Any]:
    return {"in_flight": run_in_flight(server.url, sizes), "big_bodies": run_big_bodies(server.url, sizes)}


def run_in_flight(redis_url: str, sizes: Sizes) -> dict[str, Any]:
    """Submit many calls at once to a slow upstream; sample the worker's RSS while they are in flight."""
    processes.flush(redis_url)
    with (
        processes.upstream(sizes.in_flight_latency_ms, KB) as upstream,
        processes.toolworker(redis_url, upstream.url, sizes.threads, max_concurrency=2 * sizes.in_flight_calls) as pid,
    ):
        return memory_case(upstream, pid, partial(async_burst, redis_url, sizes.in_flight_calls, 100)) | {
            "latency_ms": sizes.in_flight_latency_ms,
            "body_bytes": KB,
        }


def run_big_bodies(redis_url: str, sizes: Sizes) -> dict[str, Any]:
    """Calls at once to an upstream with huge bodies; the worker reads at most max_response_bytes of each.
    The upstream waits 100 ms before each body, so that all the calls are in flight together."""
    processes.flush(redis_url)
    with (
        processes.upstream(BIG_BODY_LATENCY_MS, sizes.big_body_bytes) as upstream,
        processes.toolworker(redis_url, upstream.url, sizes.threads, max_concurrency=RAW_CONCURRENCY) as pid,
    ):
        return memory_case(upstream, pid, partial(async_burst, redis_url, sizes.big_body_calls, 1)) | {
            "latency_ms": BIG_BODY_LATENCY_MS,
            "body_bytes": sizes.big_body_bytes,
            "max_response_bytes": DEFAULT_MAX_RESPONSE_BYTES,
        }


def memory_case(upstream: processes.Upstream, pid: int, run: Callable[[], Sample]) -> dict[str, Any]:
    idle_mb = rss_mb(pid)
    upstream.stats(reset=True)
    with Meter(pid) as meter:
        sample = run()
    stats = upstream.stats()
    return {
        "calls": sample.calls,
        "seconds": round(sample.seconds, 3),
        "max_in_flight": stats["max_in_flight"],
        "idle_rss_mb": round(idle_mb, 1),
        "rss_mb": round(meter.max_rss_mb or 0.0, 1),
        "cpu_ms_per_call": round(meter.cpu_s * 1000 / sample.calls, 3),
        "failures": sum(sample.failures.values()),
        "first_error": sample.failures.most_common(1)[0][0] if sample.failures else "",
        "truncated": sample.truncated,
    }


def targets(results: dict[str, Any]) -> list[Target]:
    found = []
    if case := results.get("in_flight"):
        found.append(_rss_target(case, f"{MIN_IN_FLIGHT:,}+ calls in flight", MIN_IN_FLIGHT))
    if case := results.get("big_bodies"):
        found.append(_rss_target(case, f"{size_label(case['body_bytes'])} bodies", case["calls"]))
    return found


def _rss_target(case: dict[str, Any], label: str, min_in_flight: int) -> Target:
    """Met when the RSS stays under the cap with the load really there (and every call answered)."""
    shown = f"{case['rss_mb']:.0f} MB max (idle {case['idle_rss_mb']:.0f} MB), {case['max_in_flight']} in flight"
    shown += f", {case['failures']} failed" if case["failures"] else ""
    met = case["rss_mb"] <= MAX_RSS_MB and case["failures"] == 0 and case["max_in_flight"] >= min_in_flight
    return Target(f"worker RSS <= {MAX_RSS_MB:.0f} MB with {label}", shown, met)


def print_section(results: dict[str, Any]) -> None:
    if case := results.get("in_flight"):
        print(
            f"\nin flight: {case['calls']} calls submitted at once (acall_many x100), upstream "
            f"{case['latency_ms']:g} ms, 1 KB: {case['max_in_flight']} in flight at the upstream at most, "
            f"worker RSS {case['idle_rss_mb']:.0f} MB idle, {case['rss_mb']:.0f} MB max, {case['seconds']:.1f} s, "
            f"{case['failures']} failed {case['first_error']}"
        )
    if case := results.get("big_bodies"):
        print(
            f"big bodies: {case['calls']} calls at once, upstream {case['latency_ms']:g} ms, bodies "
            f"{size_label(case['body_bytes'])}, {case['max_in_flight']} in flight at most, read "
            f"capped at {size_label(case['max_response_bytes'])} ({case['truncated']}/{case['calls']} truncated): "
            f"worker RSS {case['idle_rss_mb']:.0f} MB idle, {case['rss_mb']:.0f} MB max, {case['seconds']:.1f} s, "
            f"{case['failures']} failed {case['first_error']}"
        )
