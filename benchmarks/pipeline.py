"""Measure the whole pipeline against the raw aiohttp limit, side by side, in one run.

Usage: python -m benchmarks.pipeline [--calls N] [--latency-ms 0,100] [--body-bytes 1024] [--pools threads,prefork]
Every figure is also given as a ratio of the raw aiohttp limit measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from worker.client import AsyncToolClient
from worker.embedded import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 256


@contextmanager
def upstream(latency_ms: float, body_bytes: int) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.upstream", "--port", str(port)]
    argv += ["--latency-ms", str(latency_ms), "--body-bytes", str(body_bytes)]
    process = subprocess.Popen(argv, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _wait_http(url: str) -> None:
    async def probe() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(url + "/ready") as resp:
                        await resp.read()
                        return
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
        raise RuntimeError("benchmark upstream did not start")

    asyncio.run(probe())


def definitions(directory: Path, max_output_chars: int) -> Path:
    path = directory / "bench.yaml"
    path.write_text(
        "upstreams:\n"
        "  bench:\n"
        "    base_url: ${env:BENCH_UPSTREAM_URL}\n"
        "    max_concurrency: 2000\n"
        f"    max_output_chars: {max_output_chars}\n"
        "tools:\n"
        "  - name: bench_get\n"
        "    upstream: bench\n"
        "    input_schema: {type: object, properties: {i: {type: integer}}}\n"
        '    request: {method: GET, path: "/items/${i}"}\n'
    )
    return directory


@contextmanager
def worker(redis_url: str, upstream_url: str, pool: str, concurrency: int, defs: Path) -> Iterator[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env.update(
        TOOLWORKER_REDIS_URL=redis_url,
        TOOLWORKER_DEFINITIONS=str(defs),
        BENCH_UPSTREAM_URL=upstream_url,
        TOOLWORKER_LOG_LEVEL="WARNING",
    )
    argv = [sys.executable, "-m", "worker", "worker", "-P", pool, "-c", str(concurrency), "--loglevel", "WARNING"]
    # A group of its own: prefork children must not outlive their parent and eat the next case's calls.
    process = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MB."""
    pids = [pid, *_children(pid)]
    total_kb = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


def _children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in found]


async def raw_limit(url: str, calls: int) -> dict[str, Any]:
    """Raw aiohttp at the same concurrency: the limit the pipeline is compared with."""
    semaphore = asyncio.Semaphore(CONCURRENCY)
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            async with semaphore:
                started = time.perf_counter()
                async with session.get(f"{url}/items/{i}") as resp:
                    await resp.read()
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(calls)))
        elapsed = time.perf_counter() - started
    return _figures(calls, elapsed, latencies)


async def through_pipeline(redis_url: str, calls: int, batch: int) -> dict[str, Any]:
    """Submit every call, then collect every envelope; batch > 1 sends call_many messages."""
    client = AsyncToolClient(redis_url)
    await client.acall("bench_get", {"i": 0}, timeout=60)  # warm up: worker, pools, reader
    latencies: list[float] = []
    errors: Counter[str] = Counter()

    async def chunk(start: int) -> None:
        specs = [("bench_get", {"i": i}) for i in range(start, min(calls, start + batch))]
        sent = time.perf_counter()
        results = (
            await client.acall_many(specs, timeout=120) if batch > 1 else [await client.acall(*specs[0], timeout=120)]
        )
        done = time.perf_counter()
        latencies.extend(done - sent for _ in results)
        errors.update(f"{r.exit_code}: {(r.error or {}).get('message', '')}"[:120] for r in results if r.exit_code)

    started = time.perf_counter()
    await asyncio.gather(*(chunk(s) for s in range(0, calls, batch)))
    elapsed = time.perf_counter() - started
    await client.aclose()
    figures = _figures(calls, elapsed, latencies)
    figures["failures"] = sum(errors.values())
    figures["first_error"] = errors.most_common(1)[0][0] if errors else ""
    return figures


def _figures(calls: int, elapsed: float, latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)

    return {
        "calls": calls,
        "seconds": round(elapsed, 3),
        "calls_per_s": round(calls / elapsed, 1),
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            for latency in args.latency_ms:
                with upstream(latency, args.body_bytes) as url:
                    limit = asyncio.run(raw_limit(url, args.calls))
                    rows.append({"case": "raw aiohttp", "latency_ms": latency, **limit, "ratio": 1.0})
                    for pool in args.pools:
                        rows.extend(_pipeline_rows(server, url, pool, latency, limit, args))
        finally:
            server.stop()
    return rows


def _pipeline_rows(
    server: EmbeddedRedis, url: str, pool: str, latency: float, limit: dict[str, Any], args: argparse.Namespace
) -> list[dict[str, Any]]:
    concurrency = args.threads if pool == "threads" else args.processes
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        defs = definitions(Path(tmp), 16000)
        with worker(server.url, url, pool, concurrency, defs) as pid:
            for label, batch in (("single", 1), ("batched", args.batch)):
                figures = asyncio.run(through_pipeline(server.url, args.calls, batch))
                rss = rss_mb(pid)
                ratio = round(figures["calls_per_s"] / limit["calls_per_s"], 3)
                rows.append(
                    {
                        "case": f"{pool} -c{concurrency} {label}",
                        "latency_ms": latency,
                        **figures,
                        "ratio": ratio,
                        "rss_mb": round(rss, 1),
                    }
                )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    columns = ["case", "latency_ms", "calls_per_s", "ratio", "p50_ms", "p95_ms", "p99_ms", "rss_mb", "failures"]
    columns.append("first_error")
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row.get(c, "")) for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--latency-ms", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 100.0])
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--pools", type=lambda s: s.split(","), default=["threads"])
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = run(args)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
