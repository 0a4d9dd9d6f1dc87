"""Prometheus metrics of tool calls, per tool and upstream, served on `TOOLWORKER_METRICS_PORT`.

The execution layer calls two hooks: `in_flight(tool, upstream)` around the request to the upstream,
and `observe_call(envelope, upstream)` once per finished call. The circuit breaker reports through
`set_circuit_state`. prometheus-client's metrics are safe to update from any thread.

Several processes behind one port (the prefork pool): set `PROMETHEUS_MULTIPROC_DIR` to a directory
private to this worker, in the environment the worker starts with (prometheus-client reads it when it
is imported). Every process then keeps its values in files there; the metrics server of the main
process adds them up. `start_metrics_server` empties the directory, so call it before the pool starts;
`process_exited(pid)` forgets the in-flight and circuit gauges of a pool process that exited.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from wsgiref.simple_server import WSGIServer

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess, start_http_server
from prometheus_client.registry import Collector

from worker.envelope import ToolResult

log = structlog.get_logger("toolworker.metrics")

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A call that did not resolve to a defined tool: its name is model-supplied text, so it is no label.
UNRESOLVED_TOOL = "(unresolved)"
NO_UPSTREAM = "(none)"
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

CircuitState = Literal["closed", "half_open", "open"]
CIRCUIT_LEVELS: dict[CircuitState, int] = {"closed": 0, "half_open": 1, "open": 2}

CALLS = Counter(
    "toolworker_calls", "Tool calls answered, by tool, upstream and exitCode.", ["tool", "upstream", "exit_code"]
)
DURATION = Histogram(
    "toolworker_call_duration_seconds",
    "Time from the start of a call to its envelope.",
    ["tool", "upstream"],
    buckets=DURATION_BUCKETS_S,
)
IN_FLIGHT = Gauge(
    "toolworker_calls_in_flight",
    "Calls waiting on their upstream now.",
    ["tool", "upstream"],
    multiprocess_mode="livesum",
)
TRUNCATED = Counter(
    "toolworker_truncated_results", "Results cut to the output or response size cap.", ["tool", "upstream"]
)
RETRIES = Counter("toolworker_retries", "Attempts beyond the first (attempts - 1).", ["tool", "upstream"])
CIRCUIT = Gauge(
    "toolworker_circuit_state",
    "Circuit breaker of an upstream: 0 closed, 1 half-open, 2 open (the worst of the live processes).",
    ["upstream"],
    multiprocess_mode="livemax",
)
CACHE_HITS = Counter("toolworker_cache_hits", "Calls answered from the cache by a worker.", ["tool"])
CACHE_MISSES = Counter("toolworker_cache_misses", "Calls of a cached tool that a worker sent upstream.", ["tool"])


def observe_cache(tool: str, hit: bool) -> None:
    (CACHE_HITS if hit else CACHE_MISSES).labels(tool).inc()


def observe_call(envelope: ToolResult, upstream: str | None) -> None:
    """Record one finished call; `upstream` is None when the call never resolved to a defined tool."""
    tool, where = (envelope.tool, upstream) if upstream is not None else (UNRESOLVED_TOOL, NO_UPSTREAM)
    _child(CALLS, tool, where, str(envelope.exit_code)).inc()
    _child(DURATION, tool, where).observe(envelope.duration_ms / 1000)
    if envelope.truncated:
        _child(TRUNCATED, tool, where).inc()
    if envelope.attempts > 1:
        _child(RETRIES, tool, where).inc(envelope.attempts - 1)


# The labelled series of each metric, found once: `labels()` checks and joins its values on every call.
# Bounded like the series themselves (tools x upstreams x exit codes); a new definitions version that
# drops a tool leaves its entries, as prometheus-client keeps its series.
_children: dict[tuple[object, ...], Any] = {}


def _child(metric: Counter | Histogram | Gauge, *labels: str) -> Any:
    key = (metric, *labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


@contextmanager
def in_flight(tool: str, upstream: str) -> Iterator[None]:
    """Count the block as one call in flight, however it ends (also when cancelled)."""
    gauge = _child(IN_FLIGHT, tool, upstream)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


_circuit_levels: dict[str, int] = {}  # what this process last set, so that a call costs no update


def set_circuit_state(upstream: str, state: CircuitState) -> None:
    level = CIRCUIT_LEVELS[state]
    if _circuit_levels.get(upstream) != level:
        _circuit_levels[upstream] = level
        CIRCUIT.labels(upstream).set(level)


@dataclass
class MetricsServer:
    """The `/metrics` endpoint: an HTTP server on a daemon thread."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return self.server.server_port

    def close(self, timeout_s: float = 5.0) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout_s)


def start_metrics_server(
    port: int, address: str = "0.0.0.0", collectors: Sequence[Collector] = ()
) -> MetricsServer | None:
    """Serve `/metrics` on `port` (0: no server); in multiprocess mode, of every process of this worker.
    `collectors` are read at each scrape (the queue gauges)."""
    if port == 0:
        return None
    directory = multiprocess_dir()
    registry = REGISTRY if directory is None else _multiprocess_registry(directory)
    for collector in collectors:
        registry.register(collector)
    try:
        server, thread = start_http_server(port, address, registry)
    except OSError as exc:
        # Metrics must not keep a worker from running calls (e.g. two workers on one host, same port).
        log.warning("metrics.not_served", port=port, reason=str(exc))
        return None
    log.info("metrics.serving", port=server.server_port, multiprocess=directory is not None)
    return MetricsServer(server, thread)


def multiprocess_dir() -> Path | None:
    """prometheus-client's own variable (read by the library at import, so not a TOOLWORKER_* setting)."""
    value = os.environ.get(MULTIPROC_DIR_ENV)
    return Path(value) if value else None


def process_exited(pid: int) -> None:
    """Forget the live gauges of a pool process that exited (multiprocess mode only)."""
    directory = multiprocess_dir()
    if directory is not None:
        multiprocess.mark_process_dead(pid, str(directory))


def _multiprocess_registry(directory: Path) -> CollectorRegistry:
    # prometheus-client needs the directory emptied between runs: values of the last run would add up.
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, str(directory))
    return registry
