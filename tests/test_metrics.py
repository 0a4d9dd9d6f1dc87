"""Prometheus metrics: the hooks, the exposition, the multiprocess mode, and a real worker's /metrics."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import urllib.error
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from structlog.testing import capture_logs

from tests.conftest import FIXTURES, Upstream, start_worker, stop_worker, worker_env
from tests.support.prometheus import deploy_check, scrape, wait_for_sample
from tests.support.servers import DnsServer
from worker import metrics
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.envelope import ToolResult


def _tool() -> str:
    """A tool name no other test uses, so counters start at zero."""
    return f"tool_{uuid.uuid4().hex[:12]}"


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _envelope(tool: str, exit_code: int = 0, **fields: object) -> ToolResult:
    return ToolResult(call_id=str(uuid.uuid4()), tool=tool, exit_code=exit_code, **fields)


def test_observe_call_counts_by_tool_upstream_and_exit_code() -> None:
    """A finished call is counted under its tool, upstream and exitCode, and its duration is observed."""
    tool = _tool()
    metrics.observe_call(_envelope(tool, 0, duration_ms=120.0, attempts=1), "crm")
    metrics.observe_call(_envelope(tool, 0, duration_ms=80.0, attempts=1), "crm")
    metrics.observe_call(_envelope(tool, 22, duration_ms=40.0, attempts=1), "crm")
    assert _value("toolworker_calls_total", tool=tool, upstream="crm", exit_code="0") == 2
    assert _value("toolworker_calls_total", tool=tool, upstream="crm", exit_code="22") == 1
    assert _value("toolworker_call_duration_seconds_count", tool=tool, upstream="crm") == 3
    assert _value("toolworker_call_duration_seconds_sum", tool=tool, upstream="crm") == pytest.approx(0.24)
    assert _value("toolworker_call_duration_seconds_bucket", tool=tool, upstream="crm", le="0.1") == 2


def test_retries_and_truncations() -> None:
    """Retries count attempts beyond the first; a truncated result is counted; a first-try call adds no retry."""
    tool = _tool()
    metrics.observe_call(_envelope(tool, attempts=3, truncated=True), "crm")
    metrics.observe_call(_envelope(tool, attempts=1), "crm")
    metrics.observe_call(_envelope(tool, 28, attempts=2), "crm")
    assert _value("toolworker_retries_total", tool=tool, upstream="crm") == 3
    assert _value("toolworker_truncated_results_total", tool=tool, upstream="crm") == 1


def test_unresolved_tool_name_is_not_a_label() -> None:
    """A call that never resolved is counted without its model-supplied tool name (bounded label values)."""
    name = f"invented_by_a_model_{uuid.uuid4().hex}"
    before = _value(
        "toolworker_calls_total", tool=metrics.UNRESOLVED_TOOL, upstream=metrics.NO_UPSTREAM, exit_code="64"
    )
    metrics.observe_call(_envelope(name, 64), None)
    after = _value("toolworker_calls_total", tool=metrics.UNRESOLVED_TOOL, upstream=metrics.NO_UPSTREAM, exit_code="64")
    assert after == before + 1
    assert name.encode() not in generate_latest(REGISTRY)


def test_in_flight_goes_up_and_down_even_on_error() -> None:
    """in_flight counts the block while it runs and releases it when it ends, also by an exception."""
    tool = _tool()
    with metrics.in_flight(tool, "crm"):
        assert _value("toolworker_calls_in_flight", tool=tool, upstream="crm") == 1
        with metrics.in_flight(tool, "crm"):
            assert _value("toolworker_calls_in_flight", tool=tool, upstream="crm") == 2
    with pytest.raises(TimeoutError), metrics.in_flight(tool, "crm"):
        raise TimeoutError
    assert _value("toolworker_calls_in_flight", tool=tool, upstream="crm") == 0


async def test_in_flight_released_when_a_coroutine_is_cancelled() -> None:
    """A call cancelled while awaiting its upstream leaves no in-flight count behind."""
    tool = _tool()
    started = asyncio.Event()

    async def call() -> None:
        with metrics.in_flight(tool, "crm"):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(call())
    await asyncio.wait_for(started.wait(), 5)
    assert _value("toolworker_calls_in_flight", tool=tool, upstream="crm") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _value("toolworker_calls_in_flight", tool=tool, upstream="crm") == 0


def test_hooks_are_thread_safe() -> None:
    """Many threads observing at once lose no increment and leave no call in flight."""
    tool, threads, per_thread = _tool(), 16, 500

    def work(_: int) -> None:
        for _ in range(per_thread):
            with metrics.in_flight(tool, "crm"):
                metrics.observe_call(_envelope(tool, attempts=2), "crm")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    assert _value("toolworker_calls_total", tool=tool, upstream="crm", exit_code="0") == threads * per_thread
    assert _value("toolworker_retries_total", tool=tool, upstream="crm") == threads * per_thread
    assert _value("toolworker_calls_in_flight", tool=tool, upstream="crm") == 0


def test_circuit_state_gauge() -> None:
    """The circuit gauge reads 0 closed, 1 half-open, 2 open, per upstream."""
    upstream = f"up_{uuid.uuid4().hex[:8]}"
    for state, level in [("open", 2), ("half_open", 1), ("closed", 0)]:
        metrics.set_circuit_state(upstream, state)
        assert _value("toolworker_circuit_state", upstream=upstream) == level


def test_exposition_names_every_metric() -> None:
    """generate_latest shows each metric with its HELP and TYPE."""
    metrics.observe_call(_envelope(_tool(), attempts=2, truncated=True), "crm")
    text = generate_latest(REGISTRY).decode()
    for name, kind in [
        ("toolworker_calls_total", "counter"),
        ("toolworker_call_duration_seconds", "histogram"),
        ("toolworker_calls_in_flight", "gauge"),
        ("toolworker_truncated_results_total", "counter"),
        ("toolworker_retries_total", "counter"),
        ("toolworker_circuit_state", "gauge"),
    ]:
        assert f"# TYPE {name} {kind}" in text
        assert f"# HELP {name} " in text


def test_metrics_server_serves_and_closes() -> None:
    """start_metrics_server serves /metrics on the port; close() frees it; port 0 starts nothing."""
    assert metrics.start_metrics_server(0) is None
    tool = _tool()
    metrics.observe_call(_envelope(tool), "crm")
    server = metrics.start_metrics_server(free_port(), "127.0.0.1")
    assert server is not None
    try:
        samples = scrape(server.port)
        key = frozenset({"tool": tool, "upstream": "crm", "exit_code": "0"}.items())
        assert samples[("toolworker_calls_total", key)] == 1
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):
        scrape(server.port)


def test_port_in_use_is_a_warning_not_a_crash() -> None:
    """A taken port logs a warning and the worker carries on without metrics."""
    first = metrics.start_metrics_server(free_port(), "127.0.0.1")
    assert first is not None
    try:
        with capture_logs() as logs:
            assert metrics.start_metrics_server(first.port, "127.0.0.1") is None
    finally:
        first.close()
    assert [e["event"] for e in logs] == ["metrics.not_served"]
    assert logs[0]["log_level"] == "warning" and logs[0]["port"] == first.port


_CHILD = textwrap.dedent(
    """
    import os, sys
    from worker import metrics
    from worker.envelope import ToolResult
    tool = sys.argv[1]
    metrics.observe_call(ToolResult(call_id="c", tool=tool, attempts=2, duration_ms=10.0), "crm")
    metrics.set_circuit_state("crm-" + tool, sys.argv[2])
    metrics.IN_FLIGHT.labels(tool, "crm").inc()  # a process that dies with a call in flight
    print(os.getpid())
    """
)


def _run_child(env: dict[str, str], tool: str, circuit: str) -> int:
    done = subprocess.run([sys.executable, "-c", _CHILD, tool, circuit], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return int(done.stdout)


@pytest.mark.integration
def test_multiprocess_mode_adds_up_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, one server shows the sum of every process; exited ones drop their gauges."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"left over from the last run")
    monkeypatch.setenv(metrics.MULTIPROC_DIR_ENV, str(directory))
    server = metrics.start_metrics_server(free_port(), "127.0.0.1")
    assert server is not None
    try:
        assert not (directory / "counter_999999.db").exists()
        env = {**os.environ, metrics.MULTIPROC_DIR_ENV: str(directory)}
        tool = _tool()
        pids = [_run_child(env, tool, "open"), _run_child(env, tool, "closed")]
        samples = scrape(server.port)
        labels = {"tool": tool, "upstream": "crm"}
        assert samples[("toolworker_calls_total", frozenset({**labels, "exit_code": "0"}.items()))] == 2
        assert samples[("toolworker_retries_total", frozenset(labels.items()))] == 2
        assert samples[("toolworker_call_duration_seconds_count", frozenset(labels.items()))] == 2
        assert samples[("toolworker_calls_in_flight", frozenset(labels.items()))] == 2
        assert samples[("toolworker_circuit_state", frozenset({"upstream": f"crm-{tool}"}.items()))] == 2
        for pid in pids:
            metrics.process_exited(pid)
        samples = scrape(server.port)
        assert ("toolworker_calls_in_flight", frozenset(labels.items())) not in samples
        assert samples[("toolworker_calls_total", frozenset({**labels, "exit_code": "0"}.items()))] == 2
    finally:
        server.close()


@pytest.fixture(scope="module")
def metrics_worker(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, dns_server: DnsServer
) -> Iterator[tuple[str, int]]:
    """A worker with TOOLWORKER_METRICS_PORT set, on a Redis of its own (so no other worker takes its calls)."""
    directory = tmp_path_factory.mktemp("metrics-worker")
    redis = EmbeddedRedis(directory / "redis").start()
    port = free_port()
    env = worker_env(redis.url, upstream.url, dns_server.address, FIXTURES / "integration")
    env["TOOLWORKER_METRICS_PORT"] = str(port)
    process = start_worker(env, directory / "worker.log")
    try:
        yield redis.url, port
    finally:
        stop_worker(process)
        redis.stop()


@pytest.mark.integration
def test_worker_serves_metrics_after_real_calls(metrics_worker: tuple[str, int]) -> None:
    """A real worker's /metrics counts real calls by tool, upstream and exitCode, and a truncation."""
    redis_url, port = metrics_worker
    with ToolClient(redis_url) as client:
        results = [client.call("echo_get", {"item": f"m{i}"}, timeout=60) for i in range(3)]
        results.append(client.call("status", {"code": 404}, timeout=60))
        results.append(client.call("huge", {"mb": 2}, timeout=60))
        results.append(client.call("no_such_tool", {}, timeout=60))
    assert [r.exit_code for r in results] == [0, 0, 0, 22, 0, 64]
    local = {"upstream": "local"}
    ok = ("toolworker_calls_total", frozenset({**local, "tool": "echo_get", "exit_code": "0"}.items()))
    assert wait_for_sample(port, ok, 3) == 3
    truncated = ("toolworker_truncated_results_total", frozenset({**local, "tool": "huge"}.items()))
    assert wait_for_sample(port, truncated, 1) == 1
    samples = scrape(port)
    assert samples[("toolworker_calls_total", frozenset({**local, "tool": "status", "exit_code": "22"}.items()))] == 1
    assert samples[("toolworker_call_duration_seconds_count", frozenset({**local, "tool": "echo_get"}.items()))] == 3
    unresolved = {"tool": metrics.UNRESOLVED_TOOL, "upstream": metrics.NO_UPSTREAM, "exit_code": "64"}
    assert samples[("toolworker_calls_total", frozenset(unresolved.items()))] == 1
    assert samples.get(("toolworker_calls_in_flight", frozenset({**local, "tool": "echo_get"}.items())), 0) == 0


@pytest.mark.integration
def test_the_deploy_check_knows_every_series_a_real_worker_serves(metrics_worker: tuple[str, int]) -> None:
    """deploy/check.py derives the exported series from the metric definitions: a real worker's /metrics,
    after calls that set most of them, serves no toolworker series it does not know."""
    redis_url, port = metrics_worker
    with ToolClient(redis_url) as client:
        results = [client.call(tool, arguments, timeout=60) for tool, arguments in CALLS_FOR_EVERY_METRIC]
    assert [r.exit_code for r in results] == [0, 22, 0]
    truncated = frozenset({"upstream": "local", "tool": "huge"}.items())
    assert wait_for_sample(port, ("toolworker_truncated_results_total", truncated), 1) >= 1
    served = {name for name, _ in scrape(port) if name.startswith("toolworker_")}
    assert {"toolworker_calls_total", "toolworker_call_duration_seconds_bucket", "toolworker_queue_depth"} <= served
    assert {"toolworker_truncated_results_total", "toolworker_queue_in_flight"} <= served
    assert served <= deploy_check().exported_series()


CALLS_FOR_EVERY_METRIC = [("echo_get", {"item": "d"}), ("status", {"code": 404}), ("huge", {"mb": 2})]
