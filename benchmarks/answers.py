"""Answers' benchmark rows: what a cache hit costs against a miss, through the gateway and directly, and
what structured output costs per call.

Against one upstream (0 ms, 1 KB JSON), one worker and one `toolworker gateway` process, one call at a
time (light load, p50 and p95 of each):

- direct (`AsyncToolClient.acall`): a miss (new arguments each call: the worker sends it upstream and
  stores the answer) and a hit (the same arguments: the worker answers from Redis);
- through the gateway (`POST /v1/calls`): a miss (through the queue and the worker) and a hit (the
  gateway answers from Redis, without the queue);
- the uncached tool at the same upstream, direct and through the gateway: what a call cost before.

The cases take turns, call by call, so that the load of a shared machine weighs on each alike.

Structured output, in this process: `shaping.envelope` and `to_json` of one call (what a worker does
per answer) for the same body read as text (not JSON), as JSON (parsed, structuredContent beside the text)
and as JSON checked against an output schema, at 1 KB and 64 KB; microseconds per call, medians of rounds.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.harness import processes
from benchmarks.harness.constants import (
    CACHED_TOOL,
    CALL_TIMEOUT_S,
    RAW_CONCURRENCY,
    TOOL,
    UPSTREAM_BODY_BYTES,
    UPSTREAM_LATENCY_MS,
)
from worker.call import shaping
from worker.call.job import Answer, Job
from worker.client import AsyncToolClient
from worker.definitions.model import RequestTemplate, Tool, Upstream
from worker.definitions.templates import Template
from worker.http.transport import PreparedRequest, Response
from worker.protocol import ToolCall

SHAPING_SIZES = (1024, 64 * 1024)
SHAPING_ROUNDS = 5
Call = Callable[[int], Awaitable[None]]


def run(redis_url: str, light_calls: int) -> dict[str, Any]:
    """The cache rows (one call at a time) and the structured output rows."""
    processes.flush(redis_url)
    with (
        tempfile.TemporaryDirectory() as tmp,
        processes.upstream(UPSTREAM_LATENCY_MS, UPSTREAM_BODY_BYTES) as upstream,
        processes.toolworker(redis_url, upstream.url, 64, RAW_CONCURRENCY),
        processes.gateway(redis_url, processes.definitions(Path(tmp) / "definitions", RAW_CONCURRENCY)) as (
            url,
            _,
        ),
    ):
        cache_rows = asyncio.run(_cache_rows(redis_url, url, light_calls))
    return {"cache": cache_rows, "structured": structured_rows(light_calls)}


async def _cache_rows(redis_url: str, url: str, calls: int) -> list[dict[str, Any]]:
    client = AsyncToolClient(redis_url)
    try:
        async with aiohttp.ClientSession() as session:
            offset = 1_000_000  # arguments no other row used: every miss row's call is a miss
            cases: list[tuple[str, Call]] = [
                ("direct, uncached tool", _direct(client, TOOL, lambda i: i)),
                ("direct, cache miss", _direct(client, CACHED_TOOL, lambda i: offset + i)),
                ("direct, cache hit", _direct(client, CACHED_TOOL, lambda i: 7)),
                ("gateway REST, uncached tool", _rest(session, url, TOOL, lambda i: i)),
                ("gateway REST, cache miss", _rest(session, url, CACHED_TOOL, lambda i: 2 * offset + i)),
                ("gateway REST, cache hit", _rest(session, url, CACHED_TOOL, lambda i: 7)),
            ]
            rows = await _interleaved(cases, calls)
    finally:
        await client.aclose()
    return rows


def _direct(client: AsyncToolClient, tool: str, argument: Callable[[int], int]) -> Call:
    async def call(i: int) -> None:
        result = await client.acall(tool, {"i": argument(i)}, timeout=CALL_TIMEOUT_S)
        if result.exit_code:
            raise RuntimeError(f"exit {result.exit_code}")

    return call


def _rest(session: aiohttp.ClientSession, url: str, tool: str, argument: Callable[[int], int]) -> Call:
    async def call(i: int) -> None:
        body = {"tool": tool, "arguments": {"i": argument(i)}, "wait": True}
        async with session.post(url + "/v1/calls", json=body) as response:
            envelope = await response.json()
            if response.status != 200 or envelope["exitCode"]:
                raise RuntimeError(f"HTTP {response.status}: {str(envelope)[:80]}")

    return call


async def _interleaved(cases: list[tuple[str, Call]], calls: int) -> list[dict[str, Any]]:
    """Each case's calls, one case after the other in turn (so that the machine's drifting load weighs on
    every case alike); a row of p50/p95 per case."""
    latencies: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _, call in cases:
        await call(-1)  # connections open; the hit rows' answer stored
    for i in range(calls):
        for name, call in cases:
            began = time.perf_counter()
            await call(i)
            latencies[name].append(time.perf_counter() - began)
    rows = []
    for name, values in latencies.items():
        ordered = sorted(values)
        p50, p95 = statistics.median(ordered) * 1000, ordered[int(0.95 * (len(ordered) - 1))] * 1000
        rows.append({"case": name, "calls": calls, "p50_ms": round(p50, 3), "p95_ms": round(p95, 3)})
        print(f"  answers: {name}: p50 {rows[-1]['p50_ms']} ms", file=sys.stderr, flush=True)
    return rows


# Structured output, in process


def structured_rows(calls: int) -> list[dict[str, Any]]:
    rows = []
    for size in SHAPING_SIZES:
        body = json.dumps({"items": [{"id": n, "name": f"item {n}"} for n in range(size // 28)]}).encode()
        schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}}}
        cases = {
            "text (not JSON)": (b"#" + body, None),
            "JSON: structuredContent": (body, None),
            "JSON: structuredContent + output schema": (body, schema),
        }
        for case, (payload, output) in cases.items():
            rows.append({"case": case, "body_bytes": len(payload), "us_per_call": _shaping_us(payload, output, calls)})
            print(f"  answers: shaping {case} @ {len(payload)} B: {rows[-1]['us_per_call']} us", file=sys.stderr)
    return rows


def _shaping_us(body: bytes, output: dict[str, Any] | None, calls: int) -> float:
    upstream = Upstream("bench", Template.literal("http://127.0.0.1:1"))
    tool = Tool("t", "bench", RequestTemplate(), output=output)
    call = ToolCall.model_validate({"callId": "c", "tool": "t"})
    job = Job(call, tool, upstream, {}, time.time() + 60)
    request = PreparedRequest("GET", "http://127.0.0.1:1/", (), None, frozenset(), frozenset())
    response = Response(200, "OK", "application/json", "utf-8", body, True, "http://127.0.0.1:1/")
    answer = Answer(request, response, attempts=1)
    rounds = []
    for _ in range(SHAPING_ROUNDS):
        started = time.perf_counter()
        for _ in range(calls):
            shaping.envelope(job, answer).to_json()
        rounds.append((time.perf_counter() - started) / calls * 1e6)
    return round(statistics.median(rounds), 1)


def print_section(results: dict[str, Any]) -> None:
    print("\nanswers: a cache hit against a miss, one call at a time (upstream 0 ms, 1 KB JSON)")
    for row in results["cache"]:
        print(f"  {row['case']:<34} p50 {row['p50_ms']:7.3f} ms  p95 {row['p95_ms']:7.3f} ms  ({row['calls']} calls)")
    print("answers: what structured output costs a worker per call (shaping + envelope JSON, in process)")
    for row in results["structured"]:
        print(f"  {row['case']:<42} {row['body_bytes']:>7} B  {row['us_per_call']:8.1f} us/call")


def main() -> None:
    """`python -m benchmarks.answers`: this section alone, on an embedded Redis."""
    with processes.embedded_redis() as server:
        results = run(server.url, 200)
    print(f"answers benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print_section(results)


if __name__ == "__main__":
    main()
