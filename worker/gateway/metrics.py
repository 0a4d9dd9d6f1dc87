"""The gateway's Prometheus metrics, on a registry of its own (served at `/metrics` by each process)."""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from worker.envelope import ToolResult

REGISTRY = CollectorRegistry(auto_describe=True)
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

REQUESTS = Counter(
    "toolworker_gateway_requests",
    "HTTP requests answered, by front end and status.",
    ["front", "status"],
    registry=REGISTRY,
)
CALLS = Counter(
    "toolworker_gateway_calls",
    "Calls answered with an envelope, by front end and exitCode.",
    ["front", "exit_code"],
    registry=REGISTRY,
)
PENDING = Counter(
    "toolworker_gateway_calls_pending",
    "Calls left waiting (202 or a wait that ran out).",
    ["front"],
    registry=REGISTRY,
)
WITHDRAWN = Counter(
    "toolworker_gateway_calls_withdrawn", "Calls taken off the queue before they started.", registry=REGISTRY
)
CACHE_HITS = Counter(
    "toolworker_gateway_cache_hits",
    "Calls the gateway answered from the cache, without the queue.",
    ["tool"],
    registry=REGISTRY,
)
CACHE_MISSES = Counter(
    "toolworker_gateway_cache_misses",
    "Calls of a cached tool the gateway sent through the queue.",
    ["tool"],
    registry=REGISTRY,
)
DURATION = Histogram(
    "toolworker_gateway_call_seconds",
    "From a call's request to its envelope, at the gateway.",
    ["front"],
    buckets=DURATION_BUCKETS_S,
    registry=REGISTRY,
)


def observe(front: str, envelope: ToolResult | None, seconds: float) -> None:
    if envelope is None:
        PENDING.labels(front).inc()
        return
    calls, duration = _children(front, envelope.exit_code)
    calls.inc()
    duration.observe(seconds)


@lru_cache(maxsize=1024)
def _children(front: str, exit_code: int) -> tuple[Counter, Histogram]:
    """The labelled metrics of a front end and exit code, looked up once (labels() costs a lock and a dict)."""
    return CALLS.labels(front, str(exit_code)), DURATION.labels(front)


def observe_cache(tool: str, hit: bool) -> None:
    (CACHE_HITS if hit else CACHE_MISSES).labels(tool).inc()


def exposition() -> bytes:
    return generate_latest(REGISTRY)
