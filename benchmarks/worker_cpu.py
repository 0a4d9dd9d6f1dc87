"""What a call costs the worker's CPU, against what a plain aiohttp request costs, in the same run.

One worker process (`-c 64`, logging at INFO as it does by default, to a file) and a local upstream with
1 KB bodies, at 0 ms and at 100 ms. Against the same upstream, with at most CONCURRENCY calls under way:

- raw aiohttp: one `ClientSession`, CONCURRENCY requests at a time: the reference;
- single calls: `AsyncToolClient.acall` per call (the client sends one tick's calls as batch messages);
- batched calls: `acall_many` in chunks of BATCH, CONCURRENCY / BATCH chunks at a time;
- one call per message: `acall` from a client that sends every call as a message of its own
  (`max_batch=1`), as a stock Celery producer does: what each message costs beyond its call.

Per case: calls/s (and its share of raw aiohttp's), the worker's CPU per call (user + system of its
process, from /proc) against raw aiohttp's CPU per request (this process's), and this process's own CPU
per call. The cases take turns, round after round; each figure is the median of its rounds.

    python -m benchmarks.worker_cpu [--quick]       # this section alone (run.py --worker-cpu-only too)
    python -m benchmarks.worker_cpu --reference-tree DIR   # and a checkout's worker, in the same rounds
    python -m benchmarks.worker_cpu --profile DIR   # `make profile`: py-spy on the worker during bursts

The profile: py-spy samples the worker (every thread, benchmarks/harness/profiling.py) while bursts of
single calls run at a 0 ms upstream; the collapsed stacks go to DIR/worker.collapsed, a flame graph to
DIR/worker.svg, and the functions with the largest inclusive and own shares are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Awaitable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.harness import processes, profiling
from benchmarks.harness.constants import CALL_TIMEOUT_S, KB, RAW_CONCURRENCY, ROOT, START_TIMEOUT_S, TOOL
from benchmarks.harness.figures import Target
from benchmarks.harness.meter import Meter
from worker.client import AsyncToolClient

LATENCIES_MS = (0.0, 100.0)
CONCURRENCY = 200

BATCH = 50
CLIENT_MAX_BATCH = 100  # the client's default: the calls of a tick leave in messages of up to 100
# The worker takes CONCURRENCY messages at once (`-c`), as many as raw aiohttp has requests on the wire.
THREADS = CONCURRENCY
CALLS = 3000
CALLS_QUICK = 600
ROUNDS = 3
RAW = "raw aiohttp"
SINGLE = "single (acall)"
BATCHED = f"batched (acall_many x{BATCH})"
ONE_PER_MESSAGE = "one call per message"
CASES = (RAW, SINGLE, BATCHED, ONE_PER_MESSAGE)
THIS = "this tree"
REFERENCE = "reference"
# The worker as it runs by default: its call.finished line per call, written to its log file.
WORKER_ENV = {"TOOLWORKER_LOG_LEVEL": "INFO"}

# The targets, as ratios of raw aiohttp measured in the same run.
MAX_CPU_OF_RAW = 1.5  # worker CPU per call against a raw request's, 0 ms
MIN_SINGLE_SHARE_0MS = 0.60
MIN_SINGLE_SHARE_100MS = 0.90
MIN_BATCHED_SHARE = 0.60


# Measuring


def run(redis_url: str, quick: bool = False, reference: Path | None = None) -> dict[str, Any]:
    """Per upstream latency, round after round: each worker (this tree's, and the reference's when given)
    started afresh and every case measured against it, in turns; the medians."""
    calls, rounds = (CALLS_QUICK, 1) if quick else (CALLS, ROUNDS)
    trees = [(THIS, ROOT)] + ([(REFERENCE, reference)] if reference is not None else [])
    results: dict[str, Any] = {"calls": calls, "rounds": rounds, "concurrency": CONCURRENCY, "cells": {}}
    if reference is not None:
        results["reference"] = str(reference)
    for latency_ms in LATENCIES_MS:
        measured: dict[str, dict[str, list[dict[str, float]]]] = {name: {} for name, _ in trees}
        with processes.upstream(latency_ms, KB) as upstream:
            for number in range(rounds):
                for name, tree in _turn(trees, number):
                    with _worker(redis_url, upstream.url, tree) as pid:
                        for case in _turn(list(CASES), number):
                            figures = _measure(case, redis_url, upstream.url, pid, calls)
                            measured[name].setdefault(case, []).append(figures)
                            print(f"  worker cpu: {latency_ms:g} ms, {name}: {case}: {figures}", file=sys.stderr)
        results["cells"][f"{latency_ms:g}"] = _medians(measured[THIS])
        if reference is not None:
            results.setdefault("reference_cells", {})[f"{latency_ms:g}"] = _medians(measured[REFERENCE])
    return results


def _turn(items: list[Any], number: int) -> list[Any]:
    """The items starting with the round's own: each goes first in turn."""
    first = number % len(items)
    return items[first:] + items[:first]


def _measure(case: str, redis_url: str, upstream_url: str, pid: int, calls: int) -> dict[str, float]:
    if case == RAW:
        seconds, worker_s, own_s = asyncio.run(_raw(upstream_url, pid, calls))
    else:
        batch, max_batch = BATCH if case == BATCHED else 1, 1 if case == ONE_PER_MESSAGE else CLIENT_MAX_BATCH
        seconds, worker_s, own_s = asyncio.run(_toolworker(redis_url, pid, calls, batch, max_batch))
    return {
        "calls_per_s": calls / seconds,
        "worker_cpu_ms_per_call": worker_s * 1000 / calls if case != RAW else 0.0,
        "client_cpu_ms_per_call": own_s * 1000 / calls,
    }


async def _metered(pid: int, work: Awaitable[Any]) -> tuple[float, float, float]:
    """Seconds the work took, the worker's CPU seconds and this process's meanwhile."""
    with Meter(None) as own, Meter(pid) as worker:
        started = time.perf_counter()
        await work
        seconds = time.perf_counter() - started
    return seconds, worker.cpu_s, own.cpu_s


async def _raw(url: str, pid: int, calls: int) -> tuple[float, float, float]:
    """`calls` GETs, CONCURRENCY at a time, on one session whose connections are open already."""
    semaphore = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:

        async def one(i: int) -> None:
            async with semaphore, session.get(f"{url}/items/{i}") as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"raw aiohttp: HTTP {resp.status}")

        await asyncio.gather(*(one(i) for i in range(CONCURRENCY)))
        return await _metered(pid, asyncio.gather(*(one(i) for i in range(calls))))


async def _toolworker(
    redis_url: str, pid: int | None, calls: int, batch: int, max_batch: int = CLIENT_MAX_BATCH
) -> tuple[float, float, float]:
    """`calls` calls, CONCURRENCY under way at a time: `acall` each (batch 1) or `acall_many` per chunk; the
    client puts at most `max_batch` calls in a message."""
    client = AsyncToolClient(redis_url, max_batch=max_batch)
    semaphore = asyncio.Semaphore(max(1, CONCURRENCY // batch))
    failed = 0

    async def chunk(start: int) -> None:
        nonlocal failed
        specs = [(TOOL, {"i": i}) for i in range(start, min(calls, start + batch))]
        async with semaphore:
            if batch == 1:
                results = [await client.acall(*specs[0], timeout=CALL_TIMEOUT_S)]
            else:
                results = await client.acall_many(specs, timeout=CALL_TIMEOUT_S)
        failed += sum(1 for result in results if result.exit_code)

    try:
        await client.acall(TOOL, {"i": 0}, timeout=START_TIMEOUT_S)  # the reply reader is running
        work = asyncio.gather(*(chunk(start) for start in range(0, calls, batch)))
        figures = await (_metered(pid, work) if pid is not None else _timed(work))
    finally:
        await client.aclose()
    if failed:
        raise RuntimeError(f"{failed} of {calls} calls failed")
    return figures


async def _timed(work: Awaitable[Any]) -> tuple[float, float, float]:
    started = time.perf_counter()
    await work
    return time.perf_counter() - started, 0.0, 0.0


def _worker(redis_url: str, upstream_url: str, tree: Path = ROOT) -> AbstractContextManager[int]:
    env = WORKER_ENV
    return processes.toolworker(redis_url, upstream_url, THREADS, RAW_CONCURRENCY, extra_env=env, tree=tree)


def _medians(measured: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each case's median figures, with its calls/s as a share of raw aiohttp's and CPU as times raw's."""
    medians = {case: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for case, runs in measured.items()}
    raw = medians[RAW]
    for row in medians.values():
        row["share_of_raw"] = row["calls_per_s"] / raw["calls_per_s"]
        row["cpu_times_raw"] = row["worker_cpu_ms_per_call"] / raw["client_cpu_ms_per_call"]
    return medians


# Targets and output


def targets(results: dict[str, Any]) -> list[Target]:
    zero, slow = results["cells"]["0"], results["cells"]["100"]
    raw_ms = zero[RAW]["client_cpu_ms_per_call"]
    found = []
    for case in (SINGLE, BATCHED):
        times, ms = zero[case]["cpu_times_raw"], zero[case]["worker_cpu_ms_per_call"]
        found.append(
            Target(f"worker CPU per call <= {MAX_CPU_OF_RAW:g}x a raw aiohttp request's, {case}, 0 ms",
                   f"{times:.2f}x ({ms:.3f} ms against {raw_ms:.3f} ms)", times <= MAX_CPU_OF_RAW)
        )  # fmt: skip
    shares = (
        (SINGLE, "0 ms", zero, MIN_SINGLE_SHARE_0MS),
        (SINGLE, f"100 ms, {CONCURRENCY} concurrent", slow, MIN_SINGLE_SHARE_100MS),
        (BATCHED, "0 ms", zero, MIN_BATCHED_SHARE),
        (BATCHED, f"100 ms, {CONCURRENCY} concurrent", slow, MIN_BATCHED_SHARE),
    )
    for case, where, cell, share in shares:
        ratio = cell[case]["share_of_raw"]
        name = f"one worker process >= {share:.0%} of raw aiohttp's calls/s, {case}, {where}"
        found.append(Target(name, f"{ratio:.0%}", ratio >= share))
    return found


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\nworker CPU per call: one worker process (-c {THREADS}, INFO logs), 1 KB bodies, {results['calls']} calls "
        f"a case, {results['concurrency']} under way; medians of {results['rounds']} rounds, ratios within the run"
    )
    _print_cells(results["cells"])
    if "reference_cells" in results:
        print(f"  the reference worker ({results['reference']}), in the same rounds:")
        _print_cells(results["reference_cells"])


def _print_cells(cells: dict[str, dict[str, dict[str, float]]]) -> None:
    header = f"  {'upstream':<9} {'case':<28} {'calls/s':>8} {'% raw':>6} {'worker CPU ms':>14} {'x raw':>6}"
    print(header + f" {'client CPU ms':>14}")
    for latency, cell in cells.items():
        for case, row in cell.items():
            worker = f"{row['worker_cpu_ms_per_call']:.3f}" if case != RAW else "-"
            times = f"{row['cpu_times_raw']:.2f}" if case != RAW else "-"
            print(
                f"  {latency + ' ms':<9} {case:<28} {row['calls_per_s']:>8.0f} {row['share_of_raw']:>6.0%}"
                f" {worker:>14} {times:>6} {row['client_cpu_ms_per_call']:>14.3f}"
            )


# The profile


def profile(directory: Path) -> None:
    """py-spy on the worker while bursts of single calls run; the stacks saved, the top entries printed."""
    with (
        processes.embedded_redis() as server,
        processes.upstream(0.0, KB) as upstream,
        _worker(server.url, upstream.url) as pid,
    ):
        print(profiling.profile(pid, "worker", directory, lambda done: _keep_busy(server.url, done)))


def _keep_busy(redis_url: str, done: threading.Event) -> None:
    while not done.is_set():
        asyncio.run(_toolworker(redis_url, None, 1000, 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of fewer calls")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="profile the worker instead, into DIR")
    parser.add_argument("--reference-tree", type=Path, help="a checkout whose worker is measured in the same rounds")
    args = parser.parse_args(argv)
    if args.profile is not None:
        profile(args.profile)
        return
    with processes.embedded_redis() as server:
        results = run(server.url, args.quick, args.reference_tree)
    print_section(results)
    for target in targets(results):
        print(f"  [{'MET' if target.met else 'MISSED':>6}] {target.name}: {target.shown}")


if __name__ == "__main__":
    main()
