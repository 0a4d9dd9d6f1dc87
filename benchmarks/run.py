"""`make bench`: toolworker against the raw aiohttp limit and a hand-written Celery baseline, in one run.

    python -m benchmarks.run [--quick] [--latency-ms 0,100] [--body-bytes 1024,1048576]

Starts its own Redis-compatible server and, per case, a local upstream (benchmarks/upstream.py) with a
fixed latency and body size, then measures side by side at the same upstream:

- raw aiohttp, 256 requests at a time: the limit every other figure is a ratio of;
- toolworker single calls: `ToolClient.submit` for every call (one message each), then `.get()`;
- toolworker single calls through `AsyncToolClient.acall` (one tick's calls leave as batch messages);
- toolworker batched calls: `acall_many` in chunks;
- the same with one worker process per core, sharing the upstream's 256 connections between them;
- the baseline: a Celery task calling `requests` on the default prefork pool (benchmarks/baseline.py).

Latencies are per call, from its submission to its result, minus the upstream's configured latency:
in a burst (every call submitted at once) they include the wait in the queue. Separately: the added
latency at light load (one call at a time), worker RSS with 1,000+ calls in flight, and worker RSS
with 100 MB upstream bodies cut at max_response_bytes. Results go to bench-results/<time>.json and
bench-results/latest.json; a previous latest.json is compared with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import redis

from benchmarks import (
    answers,
    approvals,
    console,
    cost,
    gateway,
    identity,
    pipeline,
    replicas,
    shards,
    tenants,
    tracing,
    vault,
    webhooks,
    worker_cpu,
)
from benchmarks.pipeline import Meter, Sample
from worker.constants import DEFAULT_MAX_RESPONSE_BYTES
from worker.dev.embedded import EmbeddedRedis

KB = 1024
MB = 1024 * 1024
RESULTS_DIR = pipeline.ROOT / "bench-results"
CORES = os.cpu_count() or 1

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
MAX_RSS_MB = 150.0
MIN_IN_FLIGHT = 1000
BIG_BODY_LATENCY_MS = 100.0


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
TRACING_ROUNDS = 3
# Calls a round of the approval rows (one at a time: a p50 of fewer is mostly the machine's noise).
APPROVAL_CALLS = 1000
TENANTS_ROUNDS = 3
TENANTS_BURST = 3000  # the head-of-line burst of the issue (tenant A's calls)
TENANTS_QUICK_BURST = 500
COST_ROUNDS = 3
COST_IDLE_S = (5.0, 10.0)  # quick, full
QUICK = Sizes(600, 300, 300, 3.0, 50, 1200, 1000.0, 24)


# One row of figures


def percentile_ms(ordered_s: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted seconds, in ms."""
    index = max(0, min(len(ordered_s) - 1, math.ceil(p * len(ordered_s)) - 1))
    return ordered_s[index] * 1000


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


def run_matrix(server: EmbeddedRedis, sizes: Sizes, args: argparse.Namespace) -> tuple[list[dict[str, Any]], ...]:
    rows: list[dict[str, Any]] = []
    light: list[dict[str, Any]] = []
    for latency_ms in args.latency_ms:
        for body_bytes in args.body_bytes:
            with_light = not light and latency_ms == min(args.latency_ms) and body_bytes == min(args.body_bytes)
            cell_rows, cell_light = run_cell(server.url, Cell(latency_ms, body_bytes), sizes, with_light)
            rows += cell_rows
            light += cell_light
    return rows, light


def run_cell(
    redis_url: str, cell: Cell, sizes: Sizes, with_light: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every case against one upstream (and the light-load runs when asked), each on an empty server."""
    flush(redis_url)
    calls = sizes.calls if cell.body_bytes <= 64 * KB else sizes.calls_large_body
    rows, light = [], []
    with pipeline.upstream(cell.latency_ms, cell.body_bytes) as upstream:
        url = upstream.url
        limit = cell.row(RAW, None, partial(pipeline.raw_burst, url, calls))
        if with_light:
            light.append(cell.row("raw aiohttp", None, partial(pipeline.raw_sequential, url, sizes.light_calls)))
        # The upstream's max_concurrency is the raw limit's concurrency, shared by the processes of a worker.
        with pipeline.toolworker(redis_url, url, sizes.threads, max_concurrency=pipeline.RAW_CONCURRENCY) as pid:
            if with_light:
                run = partial(pipeline.single_sequential, redis_url, sizes.light_calls)
                light.append(cell.row("toolworker ToolClient.call", pid, run))
            rows += [cell.row(case, pid, run) for case, run in toolworker_cases(redis_url, calls, sizes.batch).items()]
        if CORES > 1:
            per_process = pipeline.RAW_CONCURRENCY // CORES
            with pipeline.toolworker(redis_url, url, sizes.threads, per_process, processes=CORES) as pid:
                rows.append(cell.row(COALESCED_N, pid, partial(pipeline.async_burst, redis_url, calls, 1)))
                rows.append(cell.row(BATCHED_N, pid, partial(pipeline.async_burst, redis_url, calls, sizes.batch)))
        # The machine's other load drifts during a cell: the limit is the mean of a measurement before the
        # toolworker cases and one after them.
        again = cell.row(RAW_AGAIN, None, partial(pipeline.raw_burst, url, calls))
        if with_light:  # what Flower's task views cost a call
            with pipeline.toolworker(redis_url, url, sizes.threads, pipeline.RAW_CONCURRENCY, task_events=False) as pid:
                run = partial(pipeline.single_sequential, redis_url, sizes.light_calls)
                light.append(cell.row("toolworker ToolClient.call, task events off", pid, run))
        with pipeline.baseline_worker(redis_url, url, CORES) as pid:
            if with_light:
                run = partial(pipeline.baseline_sequential, url, sizes.light_calls)
                light.append(cell.row("baseline .delay().get()", pid, run))
            baseline_calls = min(sizes.baseline_calls, _calls_in(sizes.baseline_seconds, cell.latency_ms))
            rows.append(cell.row(BASELINE, pid, partial(pipeline.baseline_burst, url, baseline_calls)))
    reference = limit | {"calls_per_s": (limit["calls_per_s"] + again["calls_per_s"]) / 2}
    return [with_ratios(row, reference) for row in (limit, again, *rows)], light


def toolworker_cases(redis_url: str, calls: int, batch: int) -> dict[str, Callable[[], Sample]]:
    return {
        SINGLE: partial(pipeline.single_burst, redis_url, calls),
        COALESCED: partial(pipeline.async_burst, redis_url, calls, 1),
        BATCHED: partial(pipeline.async_burst, redis_url, calls, batch),
    }


def _calls_in(seconds: float, latency_ms: float) -> int:
    """About how many calls the baseline's prefork processes finish in `seconds` at this latency."""
    return max(CORES * 4, int(seconds * CORES * 1000 / latency_ms)) if latency_ms else sys.maxsize


def flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushall()
    finally:
        client.close()


# Memory under load


def run_in_flight(redis_url: str, sizes: Sizes) -> dict[str, Any]:
    """Submit many calls at once to a slow upstream; sample the worker's RSS while they are in flight."""
    flush(redis_url)
    with (
        pipeline.upstream(sizes.in_flight_latency_ms, KB) as upstream,
        pipeline.toolworker(redis_url, upstream.url, sizes.threads, max_concurrency=2 * sizes.in_flight_calls) as pid,
    ):
        return memory_case(upstream, pid, partial(pipeline.async_burst, redis_url, sizes.in_flight_calls, 100)) | {
            "latency_ms": sizes.in_flight_latency_ms,
            "body_bytes": KB,
        }


def run_big_bodies(redis_url: str, sizes: Sizes) -> dict[str, Any]:
    """Calls at once to an upstream with huge bodies; the worker reads at most max_response_bytes of each.
    The upstream waits 100 ms before each body, so that all the calls are in flight together."""
    flush(redis_url)
    with (
        pipeline.upstream(BIG_BODY_LATENCY_MS, sizes.big_body_bytes) as upstream,
        pipeline.toolworker(redis_url, upstream.url, sizes.threads, max_concurrency=pipeline.RAW_CONCURRENCY) as pid,
    ):
        return memory_case(upstream, pid, partial(pipeline.async_burst, redis_url, sizes.big_body_calls, 1)) | {
            "latency_ms": BIG_BODY_LATENCY_MS,
            "body_bytes": sizes.big_body_bytes,
            "max_response_bytes": DEFAULT_MAX_RESPONSE_BYTES,
        }


def memory_case(upstream: pipeline.Upstream, pid: int, run: Callable[[], Sample]) -> dict[str, Any]:
    idle_mb = pipeline.rss_mb(pid)
    upstream.stats(reset=True)
    with Meter(pid) as meter:
        sample = run()
    stats = upstream.stats()
    return {
        "calls": sample.calls,
        "seconds": round(sample.seconds, 3),
        "max_in_flight": stats["max_in_flight"],
        "idle_rss_mb": round(idle_mb, 1),
        "rss_mb": round(meter.max_rss_mb or 0.0, 1),
        "cpu_ms_per_call": round(meter.cpu_s * 1000 / sample.calls, 3),
        "failures": sum(sample.failures.values()),
        "first_error": sample.failures.most_common(1)[0][0] if sample.failures else "",
        "truncated": sample.truncated,
    }


# Targets


@dataclass(frozen=True)
class Target:
    name: str
    shown: str
    met: bool


def targets(results: dict[str, Any]) -> list[Target]:
    rows = results["rows"]
    found = [*_throughput_targets(rows), *_light_targets(results["light_load"])]
    if case := results.get("gateway"):
        found += [Target(name, shown, met) for name, shown, met in gateway.targets(case)]
    if case := results.get("tenants"):
        found += [Target(name, shown, met) for name, shown, met in tenants.targets(case)]
    if case := results.get("cost"):
        found += [Target(name, shown, met) for name, shown, met in cost.targets(case)]
    if case := results.get("worker_cpu"):
        found += [Target(name, shown, met) for name, shown, met in worker_cpu.targets(case)]
    if case := results.get("in_flight"):
        found.append(_rss_target(case, f"{MIN_IN_FLIGHT:,}+ calls in flight", MIN_IN_FLIGHT))
    if case := results.get("big_bodies"):
        found.append(_rss_target(case, f"{size_label(case['body_bytes'])} bodies", case["calls"]))
    return found


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


def _rss_target(case: dict[str, Any], label: str, min_in_flight: int) -> Target:
    """Met when the RSS stays under the cap with the load really there (and every call answered)."""
    shown = f"{case['rss_mb']:.0f} MB max (idle {case['idle_rss_mb']:.0f} MB), {case['max_in_flight']} in flight"
    shown += f", {case['failures']} failed" if case["failures"] else ""
    met = case["rss_mb"] <= MAX_RSS_MB and case["failures"] == 0 and case["max_in_flight"] >= min_in_flight
    return Target(f"worker RSS <= {MAX_RSS_MB:.0f} MB with {label}", shown, met)


# Output


def cell_label(row: dict[str, Any]) -> str:
    return f"{row['latency_ms']:g} ms, {size_label(row['body_bytes'])}"


def size_label(body_bytes: int) -> str:
    if body_bytes >= MB:
        return f"{body_bytes / MB:g} MB"
    return f"{body_bytes / KB:g} KB" if body_bytes >= KB else f"{body_bytes} B"


def print_header(results: dict[str, Any]) -> None:
    print(f"toolworker benchmark, commit {results['commit']}, {CORES} cores, Python {results['python']}")
    before, after = results["load_average_before"], results["load_average_after"]
    print(f"load average (1 min): {before:.2f} before the run, {after:.2f} at its end (its own load included)\n")


LEGEND = """\
calls/s: calls / (first submission to last result); % raw: share of the raw limit's calls/s, the
  mean of the two raw aiohttp measurements (before and after the toolworker cases).
p50/p95/p99 +ms: each call from its submission to its result, minus the upstream's latency; every call
  is submitted at once, so the wait in the queue is included; (Nx): times the raw limit's figure.
CPU ms/call and RSS MB: the process (tree) making the HTTP calls: the benchmark's own for raw aiohttp,
  the toolworker worker, the baseline's prefork worker; RSS is the highest sampled during the case."""


def print_matrix(rows: list[dict[str, Any]]) -> None:
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


def print_light(light: list[dict[str, Any]]) -> None:
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


def print_memory(results: dict[str, Any]) -> None:
    if case := results.get("in_flight"):
        print(
            f"\nin flight: {case['calls']} calls submitted at once (acall_many x100), upstream "
            f"{case['latency_ms']:g} ms, 1 KB: {case['max_in_flight']} in flight at the upstream at most, "
            f"worker RSS {case['idle_rss_mb']:.0f} MB idle, {case['rss_mb']:.0f} MB max, {case['seconds']:.1f} s, "
            f"{case['failures']} failed {case['first_error']}"
        )
    if case := results.get("big_bodies"):
        print(
            f"big bodies: {case['calls']} calls at once, upstream {case['latency_ms']:g} ms, bodies "
            f"{size_label(case['body_bytes'])}, {case['max_in_flight']} in flight at most, read "
            f"capped at {size_label(case['max_response_bytes'])} ({case['truncated']}/{case['calls']} truncated): "
            f"worker RSS {case['idle_rss_mb']:.0f} MB idle, {case['rss_mb']:.0f} MB max, {case['seconds']:.1f} s, "
            f"{case['failures']} failed {case['first_error']}"
        )


def print_targets(found: list[Target]) -> None:
    print("\ntargets (ratios of the raw limit measured in this run)")
    for target in found:
        print(f"  [{'MET' if target.met else 'MISSED':>6}] {target.name}: {target.shown}")


# Results files


def comparable(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every figure a later run can be compared with, by a stable key."""
    keyed = {}
    for section in ("rows", "light_load"):
        for row in results.get(section, []):
            keyed[f"{row['case']} @ {cell_label(row)}"] = row
    for section in ("in_flight", "big_bodies"):
        if results.get(section):
            keyed[section.replace("_", " ")] = results[section]
    for row in (g := results.get("gateway") or {}).get("rows", []) + g.get("light_load", []):
        keyed[row["case"]] = row
    return keyed


def print_comparison(previous: dict[str, Any], current: dict[str, Any]) -> None:
    print(f"\ncompared with the previous run ({previous.get('timestamp')}, commit {previous.get('commit')})")
    before = comparable(previous)
    for key, row in comparable(current).items():
        old = before.get(key)
        if old is None:
            continue
        parts = [_change(old, row, "calls_per_s", "calls/s"), _change(old, row, "p50_ms", "p50 +ms")]
        parts += [_change(old, row, "cpu_ms_per_call", "CPU ms/call"), _change(old, row, "rss_mb", "RSS MB")]
        print(f"  {key:<62} " + "  ".join(p for p in parts if p))


def _change(old: dict[str, Any], new: dict[str, Any], key: str, label: str) -> str:
    if old.get(key) is None or new.get(key) is None or key not in new:
        return ""
    delta = f" ({(new[key] - old[key]) / old[key]:+.0%})" if old[key] else ""
    return f"{label} {old[key]:g} -> {new[key]:g}{delta}"


def save(results: dict[str, Any], directory: Path) -> tuple[Path, dict[str, Any] | None]:
    """Write <timestamp>.json and latest.json; return the path and the previous latest, if any."""
    directory.mkdir(parents=True, exist_ok=True)
    latest = directory / "latest.json"
    previous = json.loads(latest.read_text()) if latest.exists() else None
    text = json.dumps(results, indent=2)
    path = directory / f"{results['timestamp']}.json"
    path.write_text(text)
    latest.write_text(text)
    return path, previous


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pipeline.ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


# Entry


@contextmanager
def embedded_redis() -> Iterator[EmbeddedRedis]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            yield server
        finally:
            server.stop()


@dataclass(frozen=True)
class Section:
    """A part of the run that `--NAME-only` runs alone: what it says while it runs, how, and its printout."""

    name: str
    what: str
    run: Callable[[EmbeddedRedis, Sizes, argparse.Namespace], Any]
    show: Callable[[Any], None]


def _rounds(args: argparse.Namespace) -> int:
    return 1 if args.quick else TRACING_ROUNDS


def _cost(server: EmbeddedRedis, sizes: Sizes, args: argparse.Namespace) -> Any:
    rounds, idle_s = (1, COST_IDLE_S[0]) if args.quick else (COST_ROUNDS, COST_IDLE_S[1])
    return cost.run(server.url, sizes.calls, rounds, idle_s)


def _tenants(server: EmbeddedRedis, sizes: Sizes, args: argparse.Namespace) -> Any:
    rounds, burst = (1, TENANTS_QUICK_BURST) if args.quick else (TENANTS_ROUNDS, TENANTS_BURST)
    return tenants.run(server.url, sizes.calls, rounds, burst, args.tenants_reference_tree)


SECTIONS = (
    Section(
        "gateway",
        "gateway: MCP and REST against the direct client",
        lambda server, sizes, args: gateway.run(server.url, sizes.calls, sizes.light_calls),
        gateway.print_section,
    ),
    Section(
        "answers",
        "answers: cache hits against misses, structured output",
        lambda server, sizes, args: answers.run(server.url, sizes.light_calls),
        answers.print_section,
    ),
    Section(
        "replicas",
        "replicas: MIN_REPLICAS 0 and 1",
        lambda server, sizes, args: replicas.run(sizes.calls, sizes.light_calls, _rounds(args)),
        replicas.print_section,
    ),
    Section(
        "shards",
        "shards: three worker processes on one Redis and on three shards",
        lambda server, sizes, args: shards.run(sizes.calls, _rounds(args), 2.0 if args.quick else 5.0),
        shards.print_section,
    ),
    Section(
        "tracing",
        "tracing: off, 10% and 100% sampled",
        lambda server, sizes, args: tracing.run(server.url, sizes.calls, _rounds(args), args.reference_tree),
        tracing.print_section,
    ),
    Section(
        "identity",
        "identity: static tokens and JWT at the gateway",
        lambda server, sizes, args: identity.run(server.url, sizes.calls, sizes.light_calls, _rounds(args)),
        identity.print_section,
    ),
    Section(
        "vault",
        "vault: what acting for a user adds to a call",
        lambda server, sizes, args: vault.run(server.url, args.quick),
        vault.print_section,
    ),
    Section("cost", "cost: commands, Redis and worker CPU per call; idle polling", _cost, cost.print_section),
    Section(
        "worker_cpu",
        "worker CPU: a call against a raw aiohttp request",
        lambda server, sizes, args: worker_cpu.run(server.url, args.quick),
        worker_cpu.print_section,
    ),
    Section("tenants", "tenants: the fair take against the take before tenants", _tenants, tenants.print_section),
    Section(
        "console",
        "console: the fleet page at 100 tenants",
        lambda server, sizes, args: console.run(server.url, 100 if args.quick else console.REQUESTS),
        console.print_section,
    ),
    Section(
        "approvals",
        "approvals: the check on calls that need none",
        lambda server, sizes, args: approvals.run(server.url, max(sizes.light_calls, APPROVAL_CALLS), _rounds(args)),
        approvals.print_section,
    ),
    Section(
        "webhooks",
        "webhooks: what a delivery costs a worker",
        lambda server, sizes, args: webhooks.run(server.url, sizes.calls, _rounds(args)),
        webhooks.print_section,
    ),
)


def measure(sizes: Sizes, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "timestamp": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "commit": commit(),
        "python": platform.python_version(),
        "cores": CORES,
        "quick": args.quick,
        "sizes": asdict(sizes),
    }
    started = time.perf_counter()
    results["load_average_before"] = os.getloadavg()[0]
    only = any(getattr(args, f"{section.name}_only") for section in SECTIONS)
    with embedded_redis() as server:
        results["rows"], results["light_load"] = [], []
        if not only:
            print("matrix", file=sys.stderr, flush=True)
            results["rows"], results["light_load"] = run_matrix(server, sizes, args)
            print("memory: calls in flight, big bodies", file=sys.stderr, flush=True)
            results["in_flight"] = run_in_flight(server.url, sizes)
            results["big_bodies"] = run_big_bodies(server.url, sizes)
        for section in SECTIONS:
            if not only or getattr(args, f"{section.name}_only"):
                print(section.what, file=sys.stderr, flush=True)
                results[section.name] = section.run(server, sizes, args)
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["load_average_after"] = os.getloadavg()[0]
    results["targets"] = [asdict(t) for t in targets(results)]
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of about two minutes")
    parser.add_argument("--latency-ms", type=_floats, default=[0.0, 100.0], help="upstream latencies, e.g. 0,100")
    parser.add_argument("--body-bytes", type=_ints, default=[KB, MB], help="upstream body sizes, e.g. 1024,1048576")
    parser.add_argument("--threads", type=int, help="worker threads (-c); default 64")
    parser.add_argument("--batch", type=int, help="calls per acall_many; default 50")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--gateway-only", action="store_true", help="only the gateway's rows (about two minutes)")
    parser.add_argument("--tracing-only", action="store_true", help="only the tracing rows (about two minutes)")
    parser.add_argument("--identity-only", action="store_true", help="only the gateway's JWT-against-static rows")
    parser.add_argument("--vault-only", action="store_true", help="only the vault's rows (about a minute)")
    parser.add_argument("--replicas-only", action="store_true", help="only the MIN_REPLICAS rows (a few minutes)")
    parser.add_argument("--shards-only", action="store_true", help="only the shards' rows (a few minutes)")
    parser.add_argument("--webhooks-only", action="store_true", help="only the webhook delivery rows")
    parser.add_argument("--cost-only", action="store_true", help="only the cost-per-call rows (a few minutes)")
    parser.add_argument("--worker-cpu-only", action="store_true", help="only the worker CPU rows (a few minutes)")
    parser.add_argument("--reference-tree", type=Path, help="a checkout whose worker the tracing rows compare with")
    parser.add_argument("--tenants-only", action="store_true", help="only the tenants' rows (a few minutes)")
    parser.add_argument("--console-only", action="store_true", help="only the console's fleet page (a minute)")
    parser.add_argument("--approvals-only", action="store_true", help="only the approval check's rows (a minute)")
    parser.add_argument("--answers-only", action="store_true", help="only the cache and structured output rows")
    parser.add_argument(
        "--tenants-reference-tree",
        type=Path,
        help=f"the checkout the tenants' rows compare with (default: commit {tenants.REFERENCE_COMMIT}, from git)",
    )
    return parser.parse_args(argv)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides = {"threads": args.threads, "batch": args.batch}
    sizes = Sizes(**(asdict(sizes) | {k: v for k, v in overrides.items() if v}))
    results = measure(sizes, args)
    print_header(results)
    print_matrix(results["rows"])
    print_light(results["light_load"])
    print_memory(results)
    for section in SECTIONS:
        if results.get(section.name):
            section.show(results[section.name])
    print_targets([Target(**t) for t in results["targets"]])
    path, previous = save(results, args.results_dir)
    if previous is not None:
        print_comparison(previous, results)
    print(f"\n{results['seconds']:.0f} s; results in {path} and {path.parent / 'latest.json'}")


if __name__ == "__main__":
    main()
