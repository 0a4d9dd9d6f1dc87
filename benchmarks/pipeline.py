"""The matrix: toolworker against the raw aiohttp limit and a hand-written Celery baseline, per upstream.

For each upstream (a latency and a body size), a fresh upstream process and, side by side:

- raw aiohttp, 256 requests at a time: the limit every other figure is a ratio of;
- toolworker single calls: `ToolClient.submit` for every call (one message each), then `.get()`;
- toolworker single calls through `AsyncToolClient.acall` (one tick's calls leave as batch messages);
- toolworker batched calls: `acall_many` in chunks;
- the same with one worker process per core, sharing the upstream's 256 connections between them;
- the baseline: a Celery task calling `requests` on the default prefork pool (harness/baseline.py).

Latencies are per call, from its submission to its result, minus the upstream's configured latency:
in a burst (every call submitted at once) they include the wait in the queue. Separately, at the first
upstream: the added latency at light load (one call at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp
from celery.result import AsyncResult

from benchmarks.harness import processes
from benchmarks.harness.baseline import fetch
from benchmarks.harness.constants import CALL_TIMEOUT_S, CORES, KB, RAW_CONCURRENCY, TOOL, Sizes
from benchmarks.harness.figures import Target, cell_label, percentile_ms, size_label
from benchmarks.harness.load import async_burst, single_sequential
from benchmarks.harness.meter import Meter, Sample
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis

RAW = "raw aiohttp, 256 at a time (limit)"
RAW_AGAIN = "raw aiohttp, again after toolworker"
SINGLE = "toolworker single (ToolClient)"
COALESCED = "toolworker single (AsyncToolClient)"
BATCHED = "toolworker batched (acall_many)"
BASELINE = f"baseline Celery+requests, prefork -c{CORES}"
TOOLWORKER_CASES = (SINGLE, COALESCED, BATCHED)  # one worker process
# The same worker with one process per core (`--processes`), where there is more than one core.
PROCESSES = f"{CORES} processes"
COALESCED_N = f"{COALESCED}, {PROCESSES}"
BATCHED_N = f"{BATCHED}, {PROCESSES}"
SINGLE_CASES = (SINGLE, COALESCED, COALESCED_N)
BATCHED_CASES = (BATCHED, BATCHED_N)

# The targets of issues 6 and 31; shares are of the raw limit measured in the same run.
SINGLE_MIN_SHARE = 0.40  # at 0 ms
MAX_CPU_OF_RAW = 1.5  # the worker's CPU per call against raw aiohttp's, at 0 ms and 1 KB
BATCHED_MIN_SHARE = 0.60
SLOW_UPSTREAM_MIN_SHARE = 0.80  # one worker process at 100 ms or slower
LIGHT_LOAD_MAX_P50_MS = 5.0

# One row of figures


def figures(sample: Sample, latency_ms: float) -> dict[str, Any]:
    """Throughput, and latency added over the upstream's configured latency."""
    ordered = sorted(sample.latencies_s)
    return {
        "calls": sample.calls,
        "seconds": round(sample.seconds, 3),
        "calls_per_s": round(sample.calls / sample.seconds, 1),
        **{f"p{p}_ms": round(percentile_ms(ordered, p / 100) - latency_ms, 2) for p in (50, 95, 99)},
        "failures": sum(sample.failures.values()),
        "first_error": sample.failures.most_common(1)[0][0] if sample.failures else "",
        "truncated": sample.truncated,
    }


def make_row(case: str, latency_ms: float, body_bytes: int, sample: Sample, meter: Meter) -> dict[str, Any]:
    """Figures of one case; CPU and RSS are those of the process making the HTTP calls."""
    row = {"case": case, "latency_ms": latency_ms, "body_bytes": body_bytes, **figures(sample, latency_ms)}
    row["cpu_ms_per_call"] = round(meter.cpu_s * 1000 / sample.calls, 3)
    row["rss_mb"] = None if meter.max_rss_mb is None else round(meter.max_rss_mb, 1)
    return row


def with_ratios(row: dict[str, Any], limit: dict[str, Any]) -> dict[str, Any]:
    """Each figure as a ratio of the raw limit's (throughput: share of it; latency: times it)."""
    row["ratio"] = round(row["calls_per_s"] / limit["calls_per_s"], 3)
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        base = limit[key]
        row[key.replace("_ms", "_x")] = round(row[key] / base, 1) if base >= 0.05 else None
    return row


# The matrix


@dataclass(frozen=True)
class Cell:
    """One upstream of the matrix: its latency and body size."""

    latency_ms: float
    body_bytes: int

    def row(self, case: str, pid: int | None, run: Callable[[], Sample]) -> dict[str, Any]:
        """Run one case, metering the process that makes the HTTP calls (this one when pid is None)."""
        with Meter(pid) as meter:
            sample = run()
        row = make_row(case, self.latency_ms, self.body_bytes, sample, meter)
        print(f"  {cell_label(row)}: {case}: {row['calls_per_s']} calls/s", file=sys.stderr, flush=True)
        return row


def run(server: EmbeddedRedis, sizes: Sizes, args: argparse.Namespace) -> dict[str, Any]:
    """Every upstream of the matrix in turn; the light-load runs at the first."""
    rows: list[dict[str, Any]] = []
    light: list[dict[str, Any]] = []
    for latency_ms in args.latency_ms:
        for body_bytes in args.body_bytes:
            with_light = not light and latency_ms == min(args.latency_ms) and body_bytes == min(args.body_bytes)
            cell_rows, cell_light = run_cell(server.url, Cell(latency_ms, body_bytes), sizes, with_light)
            rows += cell_rows
            light += cell_light
    return {"rows": rows, "light_load": light}


def run_cell(
    redis_url: str, cell: Cell, sizes: Sizes, with_light: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every case against one upstream (and the light-load runs when asked), each on an empty server."""
    processes.flush(redis_url)
    calls = sizes.calls if cell.body_bytes <= 64 * KB else sizes.calls_large_body
    rows, light = [], []
    with processes.upstream(cell.latency_ms, cell.body_bytes) as upstream:
        url = upstream.url
        limit = cell.row(RAW, None, partial(raw_burst, url, calls))
        if with_light:
            light.append(cell.row("raw aiohttp", None, partial(raw_sequential, url, sizes.light_calls)))
        # The upstream's max_concurrency is the raw limit's concurrency, shared by the processes of a worker.
        with processes.toolworker(redis_url, url, sizes.threads, max_concurrency=RAW_CONCURRENCY) as pid:
            if with_light:
                run = partial(single_sequential, redis_url, sizes.light_calls)
                light.append(cell.row("toolworker ToolClient.call", pid, run))
            rows += [cell.row(case, pid, run) for case, run in toolworker_cases(redis_url, calls, sizes.batch).items()]
        if CORES > 1:
            per_process = RAW_CONCURRENCY // CORES
            with processes.toolworker(redis_url, url, sizes.threads, per_process, processes=CORES) as pid:
                rows.append(cell.row(COALESCED_N, pid, partial(async_burst, redis_url, calls, 1)))
                rows.append(cell.row(BATCHED_N, pid, partial(async_burst, redis_url, calls, sizes.batch)))
        # The machine's other load drifts during a cell: the limit is the mean of a measurement before the
        # toolworker cases and one after them.
        again = cell.row(RAW_AGAIN, None, partial(raw_burst, url, calls))
        if with_light:  # what Flower's task views cost a call
            with processes.toolworker(redis_url, url, sizes.threads, RAW_CONCURRENCY, task_events=False) as pid:
                run = partial(single_sequential, redis_url, sizes.light_calls)
                light.append(cell.row("toolworker ToolClient.call, task events off", pid, run))
        with processes.baseline_worker(redis_url, url, CORES) as pid:
            if with_light:
                run = partial(baseline_sequential, url, sizes.light_calls)
                light.append(cell.row("baseline .delay().get()", pid, run))
            baseline_calls = min(sizes.baseline_calls, _calls_in(sizes.baseline_seconds, cell.latency_ms))
            rows.append(cell.row(BASELINE, pid, partial(baseline_burst, url, baseline_calls)))
    reference = limit | {"calls_per_s": (limit["calls_per_s"] + again["calls_per_s"]) / 2}
    return [with_ratios(row, reference) for row in (limit, again, *rows)], light


def toolworker_cases(redis_url: str, calls: int, batch: int) -> dict[str, Callable[[], Sample]]:
    return {
        SINGLE: partial(single_burst, redis_url, calls),
        COALESCED: partial(async_burst, redis_url, calls, 1),
        BATCHED: partial(async_burst, redis_url, calls, batch),
    }


def _calls_in(seconds: float, latency_ms: float) -> int:
    """About how many calls the baseline's prefork processes finish in `seconds` at this latency."""
    return max(CORES * 4, int(seconds * CORES * 1000 / latency_ms)) if latency_ms else sys.maxsize


# Targets


def targets(results: dict[str, Any]) -> list[Target]:
    return [*_throughput_targets(results["rows"]), *_light_targets(results["light_load"])]


def _throughput_targets(rows: list[dict[str, Any]]) -> Iterator[Target]:
    """Per upstream, the best toolworker configuration against each target."""
    for cell in dict.fromkeys((row["latency_ms"], row["body_bytes"]) for row in rows):
        in_cell = [row for row in rows if (row["latency_ms"], row["body_bytes"]) == cell]
        label = cell_label(in_cell[0])
        if cell[0] == 0:
            yield _best(in_cell, SINGLE_CASES, f"single >= {SINGLE_MIN_SHARE:.0%} of raw ({label})", SINGLE_MIN_SHARE)
        if cell == (0, KB):
            yield from _cpu_targets(in_cell, label)
        yield _best(in_cell, BATCHED_CASES, f"batched >= {BATCHED_MIN_SHARE:.0%} of raw ({label})", BATCHED_MIN_SHARE)
        if cell[0] >= 100:
            name = f"one worker process >= {SLOW_UPSTREAM_MIN_SHARE:.0%} of raw ({label})"
            yield _best(in_cell, TOOLWORKER_CASES, name, SLOW_UPSTREAM_MIN_SHARE)


def _cpu_targets(rows: list[dict[str, Any]], label: str) -> Iterator[Target]:
    """The worker's CPU per call (one process) against raw aiohttp's, in the same cell."""
    raw = next(row for row in rows if row["case"] == RAW)["cpu_ms_per_call"]
    for row in rows:
        if row["case"] in (COALESCED, BATCHED) and raw:
            times = row["cpu_ms_per_call"] / raw
            shown = f"{times:.2f}x ({row['cpu_ms_per_call']:.3f} ms against {raw:.3f} ms)"
            name = f"worker CPU per call <= {MAX_CPU_OF_RAW:g}x raw aiohttp's: {row['case']} ({label})"
            yield Target(name, shown, times <= MAX_CPU_OF_RAW)


def _best(rows: list[dict[str, Any]], cases: tuple[str, ...], name: str, share: float) -> Target:
    best = max((row for row in rows if row["case"] in cases), key=lambda row: row["ratio"])
    return Target(name, f"{best['ratio']:.0%} of raw: {best['case']}", best["ratio"] >= share)


def _light_targets(light: list[dict[str, Any]]) -> Iterator[Target]:
    for row in light:
        if row["case"].startswith("toolworker"):
            shown = f"p50 {row['p50_ms']:.2f} ms, p95 {row['p95_ms']:.2f} ms"
            name = f"added p50 <= {LIGHT_LOAD_MAX_P50_MS:g} ms at light load: {row['case']}"
            yield Target(name, shown, row["p50_ms"] <= LIGHT_LOAD_MAX_P50_MS)


# Output


LEGEND = """\
calls/s: calls / (first submission to last result); % raw: share of the raw limit's calls/s, the
  mean of the two raw aiohttp measurements (before and after the toolworker cases).
p50/p95/p99 +ms: each call from its submission to its result, minus the upstream's latency; every call
  is submitted at once, so the wait in the queue is included; (Nx): times the raw limit's figure.
CPU ms/call and RSS MB: the process (tree) making the HTTP calls: the benchmark's own for raw aiohttp,
  the toolworker worker, the baseline's prefork worker; RSS is the highest sampled during the case."""


def print_section(results: dict[str, Any]) -> None:
    _print_rows(results["rows"])
    _print_light(results["light_load"])


def _print_rows(rows: list[dict[str, Any]]) -> None:
    print(LEGEND)
    header = f"{'case':<48} {'calls':>6} {'calls/s':>8} {'% raw':>6} {'p50 +ms':>14} {'p95 +ms':>14}"
    header += f" {'p99 +ms':>14} {'CPU ms/call':>11} {'RSS MB':>7} {'fail':>5}"
    cell: tuple[float, int] | None = None
    for row in rows:
        if (row["latency_ms"], row["body_bytes"]) != cell:
            cell = (row["latency_ms"], row["body_bytes"])
            print(f"\nupstream {cell[0]:g} ms, {size_label(cell[1])} bodies\n{header}")
        print(_matrix_line(row))
        if row["first_error"]:
            print(f"{'':<50}first error: {row['first_error']}")


def _matrix_line(row: dict[str, Any]) -> str:
    latencies = " ".join(_latency_cell(row, p) for p in (50, 95, 99))
    rss = "-" if row["rss_mb"] is None else f"{row['rss_mb']:.0f}"
    return (
        f"{row['case']:<48} {row['calls']:>6} {row['calls_per_s']:>8.0f} {row['ratio']:>6.0%} {latencies}"
        f" {row['cpu_ms_per_call']:>11.3f} {rss:>7} {row['failures']:>5}"
    )


def _latency_cell(row: dict[str, Any], p: int) -> str:
    ratio = row.get(f"p{p}_x")
    shown = ratio is not None and row["case"] not in {RAW, RAW_AGAIN}
    text = f"{row[f'p{p}_ms']:.1f}" + (f" ({ratio:g}x)" if shown else "")
    return f"{text:>14}"


def _print_light(light: list[dict[str, Any]]) -> None:
    if not light:
        return
    first = light[0]
    print(
        f"\nlight load: one call at a time, {first['calls']} calls, upstream {first['latency_ms']:g} ms, "
        f"{size_label(first['body_bytes'])}; latency added over the upstream's configured latency"
    )
    for row in light:
        rss = "" if row["rss_mb"] is None else f"  RSS {row['rss_mb']:.0f} MB"
        print(
            f"  {row['case']:<44} p50 {row['p50_ms']:7.2f} ms  p95 {row['p95_ms']:7.2f} ms"
            f"  CPU {row['cpu_ms_per_call']:.3f} ms/call{rss}"
        )


# Raw aiohttp: the limit


def raw_burst(url: str, calls: int, concurrency: int = RAW_CONCURRENCY) -> Sample:
    """Every call submitted at once, at most `concurrency` on the wire: what the pipeline is compared with."""
    return asyncio.run(_raw_burst(url, calls, concurrency))


async def _raw_burst(url: str, calls: int, concurrency: int) -> Sample:
    semaphore = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int, submitted: float) -> float:
            async with semaphore, session.get(f"{url}/items/{i}") as resp:
                await resp.read()
            return time.perf_counter() - submitted

        await asyncio.gather(*(one(i, 0.0) for i in range(concurrency)))  # the pool's connections are open
        started = time.perf_counter()
        latencies = await asyncio.gather(*(one(i, started) for i in range(calls)))
        return Sample(calls, time.perf_counter() - started, list(latencies))


def raw_sequential(url: str, calls: int) -> Sample:
    return asyncio.run(_raw_sequential(url, calls))


async def _raw_sequential(url: str, calls: int) -> Sample:
    latencies = []
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        for i in range(calls):
            sent = time.perf_counter()
            async with session.get(f"{url}/items/{i}") as resp:
                await resp.read()
            latencies.append(time.perf_counter() - sent)
        return Sample(calls, time.perf_counter() - started, latencies)


# toolworker


def single_burst(redis_url: str, calls: int) -> Sample:
    """ToolClient: submit every call (one message each), then collect every envelope."""
    with ToolClient(redis_url) as client:
        started = time.perf_counter()
        handles = []
        for i in range(calls):
            handles.append((time.perf_counter(), client.submit(TOOL, {"i": i}, timeout=CALL_TIMEOUT_S)))
        sample = Sample(calls, 0.0, [])
        for submitted, handle in handles:
            sample.add_result(handle.get(CALL_TIMEOUT_S))
            sample.latencies_s.append(time.perf_counter() - submitted)
        sample.seconds = time.perf_counter() - started
    return sample


# The hand-written baseline


def baseline_burst(upstream_url: str, calls: int) -> Sample:
    """`fetch.delay(url)` for every call, then `.get()` for each."""
    started = time.perf_counter()
    pending = [(time.perf_counter(), fetch.delay(f"{upstream_url}/items/{i}")) for i in range(calls)]
    sample = Sample(calls, 0.0, [])
    for submitted, result in pending:
        _collect_baseline(sample, result, submitted)
    sample.seconds = time.perf_counter() - started
    return sample


def baseline_sequential(upstream_url: str, calls: int) -> Sample:
    sample = Sample(calls, 0.0, [])
    started = time.perf_counter()
    for i in range(calls):
        sent = time.perf_counter()
        _collect_baseline(sample, fetch.delay(f"{upstream_url}/items/{i}"), sent)
    sample.seconds = time.perf_counter() - started
    return sample


def _collect_baseline(sample: Sample, result: AsyncResult, submitted: float) -> None:
    try:
        answer = result.get(timeout=CALL_TIMEOUT_S)
    except Exception as exc:  # a failed task re-raises its own exception here: count it, keep going
        sample.failures[f"{type(exc).__name__}: {exc}"[:120]] += 1
    else:
        if answer["status"] != 200:
            sample.failures[f"HTTP {answer['status']}"] += 1
    sample.latencies_s.append(time.perf_counter() - submitted)
