"""The benchmarks' shared constants: the tool they call, their timeouts, the sizes of a run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
KB = 1024
MB = 1024 * 1024
CORES = os.cpu_count() or 1
TOOL = "bench_get"
# The same request, its answers cached (benchmarks/answers.py).
CACHED_TOOL = "bench_cached"
RAW_CONCURRENCY = 256
# Calls in flight through the gateway's surfaces and the direct client they are compared with.
CONCURRENCY = 64
# The upstream of the sections that measure the toolworker's own cost: no latency, small bodies.
UPSTREAM_LATENCY_MS = 0.0
UPSTREAM_BODY_BYTES = 1024
MANY_TENANTS = 100
CALL_TIMEOUT_S = 300.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Sizes:
    calls: int  # per case with 1 KB bodies
    calls_large_body: int  # per case with bodies over 64 KB
    baseline_calls: int  # most baseline calls per case
    baseline_seconds: float  # the baseline's calls are cut to about this long at a slow upstream
    light_calls: int
    in_flight_calls: int
    in_flight_latency_ms: float
    big_body_calls: int
    big_body_bytes: int = 100 * MB
    threads: int = 64
    batch: int = 50


FULL = Sizes(5000, 2000, 2000, 10.0, 200, 1200, 1000.0, 32)
QUICK = Sizes(600, 300, 300, 3.0, 50, 1200, 1000.0, 24)
