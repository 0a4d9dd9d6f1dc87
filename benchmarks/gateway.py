"""The gateway's benchmark rows: MCP `tools/call` and `POST /v1/calls` against `AsyncToolClient` direct.

Against one upstream (0 ms, 1 KB), one worker and one `toolworker gateway` process, side by side:

- `AsyncToolClient` direct, 64 calls in flight: the reference every gateway figure is a ratio of;
- REST: `POST /v1/calls`, waiting for the envelope, 64 in flight (aiohttp);
- MCP: `tools/call` over Streamable HTTP at the 2026-07-28 revision, 64 in flight. The load comes from
  plain aiohttp speaking the protocol (one POST per call, `_meta` as the revision wants it): the `mcp`
  SDK's Python client spends more CPU per call than the gateway, and on two cores it would measure itself;
- MCP through the SDK's own `Client`, 64 in flight, for what an SDK user sees on the same machine;
- light load: each of them one call at a time; the gateway's added p50 is its p50 minus the direct one.

The gateway's CPU per call is metered too: on a small machine it is what bounds its calls/s.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import redis

from benchmarks import pipeline
from benchmarks.pipeline import Meter, Sample
from worker.client import AsyncToolClient
from worker.dev.embedded import free_port

CONCURRENCY = 64
UPSTREAM_LATENCY_MS = 0.0
UPSTREAM_BODY_BYTES = 1024
DIRECT = "AsyncToolClient direct, 64 in flight"
REST = "gateway REST POST /v1/calls, 64 in flight"
MCP = "gateway MCP tools/call (2026-07-28), 64 in flight"
MCP_SDK = "gateway MCP via the SDK's Client, 64 in flight"
# The targets of issue 14, judged on ratios of the direct client measured in the same run.
MIN_SHARE = 0.60
MAX_ADDED_P50_MS = 3.0
MODERN = "2026-07-28"
_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "toolworker-bench", "version": "1"},
}
Call = Callable[[int], Awaitable[None]]


@contextmanager
def gateway(redis_url: str, definitions: Path, **settings: str) -> Iterator[tuple[str, int]]:
    """`toolworker gateway` on a free loopback port (no tokens unless `settings` name some); yields its URL
    and pid once it answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
    env |= {
        "TOOLWORKER_REDIS_URL": redis_url,
        "TOOLWORKER_DEFINITIONS": str(definitions),
        "TOOLWORKER_LOG_LEVEL": "WARNING",
        **settings,
    }
    argv = [sys.executable, "-m", "worker", "gateway", "--port", str(port)]
    with tempfile.TemporaryDirectory() as tmp, pipeline.process_group(argv, env, Path(tmp) / "gateway.log") as pid:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(_until_ready(url))
        yield url, pid


async def _until_ready(url: str) -> None:
    deadline = time.monotonic() + pipeline.START_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway at {url} did not become ready")
            await asyncio.sleep(0.1)


# One way of calling each


async def _measure(call: Call, calls: int, concurrency: int) -> Sample:
    await call(-1)  # connections open, readers running
    sample = Sample(calls, 0.0, [])
    counter = itertools.count()
    if concurrency == 1:
        started = time.perf_counter()
        for i in range(calls):
            await _timed(call, i, sample)
    else:

        async def lane() -> None:
            while (i := next(counter)) < calls:
                await _timed(call, i, sample)

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
    sample.seconds = time.perf_counter() - started
    return sample


async def _timed(call: Call, i: int, sample: Sample) -> None:
    began = time.perf_counter()
    try:
        await call(i)
    except Exception as exc:  # counted, shown as the case's first error
        sample.failures[f"{type(exc).__name__}: {exc}"[:120]] += 1
    sample.latencies_s.append(time.perf_counter() - began)


async def _direct(redis_url: str, calls: int, concurrency: int) -> Sample:
    client = AsyncToolClient(redis_url)

    async def call(i: int) -> None:
        result = await client.acall(pipeline.TOOL, {"i": i}, timeout=pipeline.CALL_TIMEOUT_S)
        if result.exit_code:
            raise RuntimeError(f"exit {result.exit_code}")

    try:
        return await _measure(call, calls, concurrency)
    finally:
        await client.aclose()


async def _rest(url: str, calls: int, concurrency: int, headers: dict[str, str] | None = None) -> Sample:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def call(i: int) -> None:
            body = {"tool": pipeline.TOOL, "arguments": {"i": i}}
            async with session.post(url + "/v1/calls", json=body) as response:
                envelope = await response.json()
                if response.status != 200 or envelope["exitCode"]:
                    raise RuntimeError(f"HTTP {response.status}: {str(envelope)[:80]}")

        return await _measure(call, calls, concurrency)


async def _mcp(url: str, calls: int, concurrency: int, auth: dict[str, str] | None = None) -> Sample:
    headers = {
        **(auth or {}),
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": pipeline.TOOL,
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), headers=headers) as session:

        async def call(i: int) -> None:
            params = {"name": pipeline.TOOL, "arguments": {"i": i}, "_meta": _META}
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
            async with session.post(url + "/mcp", json=body) as response:
                answer: dict[str, Any] = await response.json()
                if "result" not in answer or answer["result"]["isError"]:
                    raise RuntimeError(str(answer)[:100])

        return await _measure(call, calls, concurrency)


async def _mcp_sdk(url: str, calls: int, concurrency: int) -> Sample:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    limits = httpx2.Limits(max_connections=concurrency)
    async with (
        httpx2.AsyncClient(limits=limits, timeout=pipeline.CALL_TIMEOUT_S) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
    ):

        async def call(i: int) -> None:
            result = await client.call_tool(pipeline.TOOL, {"i": i})
            if result.is_error:
                raise RuntimeError(str(result.content)[:100])

        return await _measure(call, calls, concurrency)


# The cases, metered


def run(redis_url: str, calls: int, light_calls: int) -> dict[str, Any]:
    """Every gateway case against a fresh upstream, worker and gateway; rows with ratios of the direct client."""
    _flush(redis_url)
    with (
        tempfile.TemporaryDirectory() as tmp,
        pipeline.upstream(UPSTREAM_LATENCY_MS, UPSTREAM_BODY_BYTES) as upstream,
        pipeline.toolworker(redis_url, upstream.url, 64, pipeline.RAW_CONCURRENCY) as worker_pid,
        gateway(redis_url, pipeline.definitions(Path(tmp) / "definitions", pipeline.RAW_CONCURRENCY)) as (url, pid),
    ):
        cases: list[tuple[str, Callable[[int, int], Awaitable[Sample]]]] = [
            (DIRECT, lambda n, c: _direct(redis_url, n, c)),
            (REST, lambda n, c: _rest(url, n, c)),
            (MCP, lambda n, c: _mcp(url, n, c)),
            (MCP_SDK, lambda n, c: _mcp_sdk(url, n, c)),
        ]
        rows = [_row(name, pid, worker_pid, measure, calls, CONCURRENCY) for name, measure in cases]
        light = [_row(name, pid, worker_pid, measure, light_calls, 1) for name, measure in cases]
    return {"rows": _with_ratios(rows), "light_load": _with_added(light)}


def _flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushall()
    finally:
        client.close()


def _row(
    case: str, gateway_pid: int, worker_pid: int, measure: Callable[[int, int], Awaitable[Sample]], calls: int, c: int
) -> dict[str, Any]:
    with Meter(gateway_pid) as gateway_meter, Meter(worker_pid) as worker_meter:
        sample = asyncio.run(measure(calls, c))
    ordered = sorted(sample.latencies_s)
    row = {
        "case": case if c > 1 else case.replace(", 64 in flight", ", one at a time"),
        "concurrency": c,
        "calls": sample.calls,
        "seconds": round(sample.seconds, 3),
        "calls_per_s": round(sample.calls / sample.seconds, 1),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(_percentile_ms(ordered, 0.95), 2),
        "gateway_cpu_ms_per_call": None if case == DIRECT else round(gateway_meter.cpu_s * 1000 / sample.calls, 3),
        "worker_cpu_ms_per_call": round(worker_meter.cpu_s * 1000 / sample.calls, 3),
        "failures": sum(sample.failures.values()),
        "first_error": sample.failures.most_common(1)[0][0] if sample.failures else "",
    }
    print(f"  gateway: {row['case']}: {row['calls_per_s']} calls/s", file=sys.stderr, flush=True)
    return row


def _percentile_ms(ordered_s: list[float], p: float) -> float:
    """Nearest rank, in ms."""
    return ordered_s[max(0, min(len(ordered_s) - 1, math.ceil(p * len(ordered_s)) - 1))] * 1000


def _with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    direct = rows[0]["calls_per_s"]
    return [row | {"ratio": round(row["calls_per_s"] / direct, 3)} for row in rows]


def _with_added(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    direct = rows[0]["p50_ms"]
    return [row | {"added_p50_ms": round(row["p50_ms"] - direct, 2)} for row in rows]


# Output and targets


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\ngateway: upstream {UPSTREAM_LATENCY_MS:g} ms, {UPSTREAM_BODY_BYTES // 1024} KB; one worker, one gateway "
        "process; ratios of the direct client in this run"
    )
    header = f"  {'case':<52} {'calls':>6} {'calls/s':>8} {'% direct':>9} {'p50 ms':>7} {'p95 ms':>7}"
    print(header + f" {'gateway CPU ms/call':>20} {'worker CPU ms/call':>19} {'fail':>5}")
    for row in results["rows"]:
        print(_line(row, f"{row['ratio']:>9.0%}"))
    print("  light load, one call at a time (added p50: over the direct client's p50)")
    for row in results["light_load"]:
        print(_line(row, f"{row['added_p50_ms']:>+8.2f}ms"))


def _line(row: dict[str, Any], relative: str) -> str:
    gateway_cpu = "-" if row["gateway_cpu_ms_per_call"] is None else f"{row['gateway_cpu_ms_per_call']:.3f}"
    return (
        f"  {row['case']:<52} {row['calls']:>6} {row['calls_per_s']:>8.0f} {relative} {row['p50_ms']:>7.2f}"
        f" {row['p95_ms']:>7.2f} {gateway_cpu:>20} {row['worker_cpu_ms_per_call']:>19.3f} {row['failures']:>5}"
    )


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, figure, met) for MCP and REST: calls/s share and added p50 at light load."""
    found = []
    for case in (MCP, REST):
        row = next(r for r in results["rows"] if r["case"] == case)
        name = f"{case.split(',')[0]} >= {MIN_SHARE:.0%} of the direct client's calls/s"
        found.append((name, f"{row['ratio']:.0%}", row["ratio"] >= MIN_SHARE and not row["failures"]))
        light = next(r for r in results["light_load"] if r["case"].startswith(case.split(",")[0]))
        name = f"{case.split(',')[0]} adds <= {MAX_ADDED_P50_MS:g} ms p50 at light load"
        found.append((name, f"{light['added_p50_ms']:+.2f} ms", light["added_p50_ms"] <= MAX_ADDED_P50_MS))
    return found
