"""The gateway's benchmark rows: MCP `tools/call` and `POST /v1/calls` against `AsyncToolClient` direct.

Against one upstream (0 ms, 1 KB), one worker and one `toolworker gateway` process, side by side:

- `AsyncToolClient` direct, 64 calls in flight: the reference every gateway figure is a ratio of;
- REST: `POST /v1/calls`, waiting for the envelope, 64 in flight (aiohttp);
- MCP: `tools/call` over Streamable HTTP at the 2026-07-28 revision, 64 in flight. The load comes from
  plain aiohttp speaking the protocol (one POST per call, `_meta` as the revision wants it): the `mcp`
  SDK's Python client spends more CPU per call than the gateway, and on two cores it would measure itself;
- MCP through the SDK's own `Client`, 64 in flight, for what an SDK user sees on the same machine;
- light load: each of them one call at a time; the gateway's added p50 is its p50 minus the direct one.

The gateway's CPU per call is metered too: on a small machine it is what bounds its calls/s. The loaded cases
run in ROUNDS rounds, each case once a round and each ratio of that round's direct client; a case's row is its
median round (the ratio of one run swings by several points on a shared two-core machine).

    python -m benchmarks.gateway --profile DIR [--rest]   # py-spy on the gateway while MCP (or REST) calls run
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

from benchmarks.harness import processes, profiling
from benchmarks.harness.constants import CONCURRENCY, RAW_CONCURRENCY, UPSTREAM_BODY_BYTES, UPSTREAM_LATENCY_MS
from benchmarks.harness.figures import Target
from benchmarks.harness.load import Measure, direct, gateway_row, mcp, mcp_sdk, rest

DIRECT = "AsyncToolClient direct, 64 in flight"
REST = "gateway REST POST /v1/calls, 64 in flight"
MCP = "gateway MCP tools/call (2026-07-28), 64 in flight"
MCP_SDK = "gateway MCP via the SDK's Client, 64 in flight"
# The targets of issue 14, judged on ratios of the direct client measured in the same run.
MIN_SHARE = 0.60
MAX_ADDED_P50_MS = 3.0
ROUNDS = 3


# The cases, metered


def run(redis_url: str, calls: int, light_calls: int) -> dict[str, Any]:
    """Every gateway case against a fresh upstream, worker and gateway; rows with ratios of the direct client."""
    processes.flush(redis_url)
    with (
        tempfile.TemporaryDirectory() as tmp,
        processes.upstream(UPSTREAM_LATENCY_MS, UPSTREAM_BODY_BYTES) as upstream,
        processes.toolworker(redis_url, upstream.url, 64, RAW_CONCURRENCY) as worker_pid,
        processes.gateway(redis_url, processes.definitions(Path(tmp) / "definitions", RAW_CONCURRENCY)) as (url, pid),
    ):
        cases: list[tuple[str, Measure]] = [
            (DIRECT, lambda n, c: direct(redis_url, n, c)),
            (REST, lambda n, c: rest(url, n, c)),
            (MCP, lambda n, c: mcp(url, n, c)),
            (MCP_SDK, lambda n, c: mcp_sdk(url, n, c)),
        ]
        rounds = [
            _with_ratios([_row(name, (pid, worker_pid), measure, calls, CONCURRENCY) for name, measure in cases])
            for _ in range(ROUNDS)
        ]
        light = [_row(name, (pid, worker_pid), measure, light_calls, 1) for name, measure in cases]
    return {"rows": [_median(list(case)) for case in zip(*rounds, strict=True)], "light_load": _with_added(light)}


def _row(case: str, pids: tuple[int, int], measure: Measure, calls: int, c: int) -> dict[str, Any]:
    return gateway_row(case, pids, measure, calls, c, gateway_cpu=case != DIRECT)


def _with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reference = rows[0]["calls_per_s"]
    return [row | {"ratio": round(row["calls_per_s"] / reference, 3)} for row in rows]


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A case's median round (by its ratio; the direct client's by its calls/s), with every round's ratio."""
    key = "calls_per_s" if rows[0]["case"] == DIRECT else "ratio"
    middle = sorted(rows, key=lambda row: row[key])[len(rows) // 2]
    return middle | {"round_ratios": [row["ratio"] for row in rows]}


def _with_added(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reference = rows[0]["p50_ms"]
    return [row | {"added_p50_ms": round(row["p50_ms"] - reference, 2)} for row in rows]


# Output and targets


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\ngateway: upstream {UPSTREAM_LATENCY_MS:g} ms, {UPSTREAM_BODY_BYTES // 1024} KB; one worker, one gateway "
        "process; ratios of the direct client in this run"
    )
    print(f"  loaded cases: the median of {ROUNDS} rounds (% direct: of the same round's direct client)")
    header = f"  {'case':<52} {'calls':>6} {'calls/s':>8} {'% direct':>9} {'p50 ms':>7} {'p95 ms':>7}"
    print(header + f" {'gateway CPU ms/call':>20} {'worker CPU ms/call':>19} {'fail':>5}")
    for row in results["rows"]:
        print(_line(row, f"{row['ratio']:>9.0%}"))
    for row in results["rows"][1:]:
        print(f"  rounds, {row['case'].split(',')[0]}: {', '.join(f'{r:.0%}' for r in row.get('round_ratios', []))}")
    print("  light load, one call at a time (added p50: over the direct client's p50)")
    for row in results["light_load"]:
        print(_line(row, f"{row['added_p50_ms']:>+8.2f}ms"))


def _line(row: dict[str, Any], relative: str) -> str:
    gateway_cpu = "-" if row["gateway_cpu_ms_per_call"] is None else f"{row['gateway_cpu_ms_per_call']:.3f}"
    return (
        f"  {row['case']:<52} {row['calls']:>6} {row['calls_per_s']:>8.0f} {relative} {row['p50_ms']:>7.2f}"
        f" {row['p95_ms']:>7.2f} {gateway_cpu:>20} {row['worker_cpu_ms_per_call']:>19.3f} {row['failures']:>5}"
    )


def targets(results: dict[str, Any]) -> list[Target]:
    """MCP's and REST's targets: their share of the direct client's calls/s, their added p50 at light load."""
    found = []
    for case in (MCP, REST):
        row = next(r for r in results["rows"] if r["case"] == case)
        name = f"{case.split(',')[0]} >= {MIN_SHARE:.0%} of the direct client's calls/s"
        found.append(Target(name, f"{row['ratio']:.0%}", row["ratio"] >= MIN_SHARE and not row["failures"]))
        light = next(r for r in results["light_load"] if r["case"].startswith(case.split(",")[0]))
        name = f"{case.split(',')[0]} adds <= {MAX_ADDED_P50_MS:g} ms p50 at light load"
        found.append(Target(name, f"{light['added_p50_ms']:+.2f} ms", light["added_p50_ms"] <= MAX_ADDED_P50_MS))
    return found


# The profile


def profile(directory: Path, rest_calls: bool = False) -> None:
    """py-spy on the gateway while bursts of MCP (or REST) calls run, 64 in flight; the top entries printed."""
    load = rest if rest_calls else mcp
    with (
        processes.embedded_redis() as server,
        tempfile.TemporaryDirectory() as tmp,
        processes.upstream(UPSTREAM_LATENCY_MS, UPSTREAM_BODY_BYTES) as upstream,
        processes.toolworker(server.url, upstream.url, 64, RAW_CONCURRENCY),
        processes.gateway(server.url, processes.definitions(Path(tmp) / "definitions", RAW_CONCURRENCY)) as (url, pid),
    ):

        def keep_busy(done: threading.Event) -> None:
            while not done.is_set():
                asyncio.run(load(url, 1000, CONCURRENCY))

        print(profiling.profile(pid, "gateway", directory, keep_busy))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, metavar="DIR", required=True, help="where the stacks go")
    parser.add_argument("--rest", action="store_true", help="REST calls instead of MCP ones")
    arguments = parser.parse_args()
    profile(arguments.profile, arguments.rest)
