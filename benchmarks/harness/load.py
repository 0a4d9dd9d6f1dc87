"""The ways a scenario sends calls and times them: the clients in a burst or one at a time, and the
gateway's surfaces (REST, MCP over plain HTTP and through the SDK's client) with so many in flight.

A burst submits every call at once and then collects, so its latencies include the wait in the queue; a
sequential run sends one call at a time, so its latencies are the pipeline's own overhead.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from benchmarks.harness.constants import CALL_TIMEOUT_S, START_TIMEOUT_S, TOOL
from benchmarks.harness.figures import percentile_ms
from benchmarks.harness.meter import Meter, Sample
from worker.client import AsyncToolClient, ToolClient

MODERN = "2026-07-28"
_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "toolworker-bench", "version": "1"},
}
Call = Callable[[int], Awaitable[None]]
# A way of calling: (calls, in flight) -> its Sample.
Measure = Callable[[int, int], Awaitable[Sample]]


# The clients


def single_sequential(redis_url: str, calls: int) -> Sample:
    """ToolClient.call, one at a time."""
    with ToolClient(redis_url) as client:
        sample = Sample(calls, 0.0, [])
        started = time.perf_counter()
        for i in range(calls):
            sent = time.perf_counter()
            sample.add_result(client.call(TOOL, {"i": i}, timeout=CALL_TIMEOUT_S))
            sample.latencies_s.append(time.perf_counter() - sent)
        sample.seconds = time.perf_counter() - started
    return sample


def async_burst(redis_url: str, calls: int, batch: int) -> Sample:
    """AsyncToolClient: `acall` per call (batch 1; the client coalesces one tick's calls into batch
    messages) or `acall_many` per chunk of `batch`, all submitted at once."""
    return asyncio.run(_async_burst(redis_url, calls, batch))


async def _async_burst(redis_url: str, calls: int, batch: int) -> Sample:
    async with AsyncToolClient(redis_url) as client:
        await client.acall(TOOL, {"i": 0}, timeout=START_TIMEOUT_S)  # the reply reader is running
        sample = Sample(calls, 0.0, [])

        async def chunk(start: int, submitted: float) -> None:
            specs = [(TOOL, {"i": i}) for i in range(start, min(calls, start + batch))]
            if batch == 1:
                results = [await client.acall(*specs[0], timeout=CALL_TIMEOUT_S)]
            else:
                results = await client.acall_many(specs, timeout=CALL_TIMEOUT_S)
            done = time.perf_counter()
            for result in results:
                sample.add_result(result)
                sample.latencies_s.append(done - submitted)

        started = time.perf_counter()
        await asyncio.gather(*(chunk(start, started) for start in range(0, calls, batch)))
        sample.seconds = time.perf_counter() - started
        return sample


async def tenants_burst(redis_url: str, calls: int, tenants: list[str], shards: str | None = None) -> float:
    """`calls` calls at once, spread over `tenants` (on `shards` when given): the seconds they took."""
    async with AsyncToolClient(redis_url, shards=shards) as client:
        await client.acall(TOOL, {"i": 0}, timeout=START_TIMEOUT_S)  # the reply reader is running
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                client.acall(TOOL, {"i": i}, timeout=CALL_TIMEOUT_S, tenant=tenants[i % len(tenants)])
                for i in range(calls)
            )
        )
        seconds = time.perf_counter() - started
    failed = [r for r in results if r.exit_code]
    if failed:
        codes = Counter(r.exit_code for r in failed)
        first = (failed[0].error or {}).get("message", "")
        raise RuntimeError(f"{len(failed)} of {calls} calls failed (exit codes {dict(codes)}; the first: {first})")
    return seconds


# The gateway's surfaces, and the direct client they are compared with


async def measure(call: Call, calls: int, concurrency: int) -> Sample:
    """`calls` calls, `concurrency` at a time (each lane sends its next call once its last is answered)."""
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


async def direct(redis_url: str, calls: int, concurrency: int) -> Sample:
    async with AsyncToolClient(redis_url) as client:

        async def call(i: int) -> None:
            result = await client.acall(TOOL, {"i": i}, timeout=CALL_TIMEOUT_S)
            if result.exit_code:
                raise RuntimeError(f"exit {result.exit_code}")

        return await measure(call, calls, concurrency)


async def rest(url: str, calls: int, concurrency: int, headers: dict[str, str] | None = None) -> Sample:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def call(i: int) -> None:
            body = {"tool": TOOL, "arguments": {"i": i}}
            async with session.post(url + "/v1/calls", json=body) as response:
                envelope = await response.json()
                if response.status != 200 or envelope["exitCode"]:
                    raise RuntimeError(f"HTTP {response.status}: {str(envelope)[:80]}")

        return await measure(call, calls, concurrency)


async def mcp(url: str, calls: int, concurrency: int, auth: dict[str, str] | None = None) -> Sample:
    """MCP `tools/call` over Streamable HTTP at the 2026-07-28 revision, from plain aiohttp (one POST a call)."""
    headers = {
        **(auth or {}),
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": TOOL,
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), headers=headers) as session:

        async def call(i: int) -> None:
            params = {"name": TOOL, "arguments": {"i": i}, "_meta": _META}
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
            async with session.post(url + "/mcp", json=body) as response:
                answer: dict[str, Any] = await response.json()
                if "result" not in answer or answer["result"]["isError"]:
                    raise RuntimeError(str(answer)[:100])

        return await measure(call, calls, concurrency)


async def mcp_sdk(url: str, calls: int, concurrency: int) -> Sample:
    """MCP through the SDK's own `Client`, as an SDK user sees it."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    limits = httpx2.Limits(max_connections=concurrency)
    async with (
        httpx2.AsyncClient(limits=limits, timeout=CALL_TIMEOUT_S) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
    ):

        async def call(i: int) -> None:
            result = await client.call_tool(TOOL, {"i": i})
            if result.is_error:
                raise RuntimeError(str(result.content)[:100])

        return await measure(call, calls, concurrency)


def gateway_row(
    case: str, pids: tuple[int, int], measure: Measure, calls: int, c: int, *, gateway_cpu: bool = True
) -> dict[str, Any]:
    """One way of calling, metered: the gateway's and the worker's CPU per call (`pids`: gateway, worker)."""
    gateway_pid, worker_pid = pids
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
        "p95_ms": round(percentile_ms(ordered, 0.95), 2),
        "gateway_cpu_ms_per_call": round(gateway_meter.cpu_s * 1000 / sample.calls, 3) if gateway_cpu else None,
        "worker_cpu_ms_per_call": round(worker_meter.cpu_s * 1000 / sample.calls, 3),
        "failures": sum(sample.failures.values()),
        "first_error": sample.failures.most_common(1)[0][0] if sample.failures else "",
    }
    print(f"  gateway: {row['case']}: {row['calls_per_s']} calls/s", file=sys.stderr, flush=True)
    return row
