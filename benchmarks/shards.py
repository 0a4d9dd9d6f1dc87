"""What sharding gives and costs: the same fleet of three worker processes on one Redis, then on three.

Four Redis-compatible servers of their own (127.0.0.1), a 0 ms upstream with 1 KB bodies, two workers
running side by side: `--processes 3` on one server (the reference), and one `toolworker worker` on
TOOLWORKER_REDIS_SHARDS of the three others (a process per shard: three as well). For each, a burst over
100 tenants through `AsyncToolClient` (the sharded one with `shards=`): calls/s, Redis commands per call
and main-thread CPU per call summed over its servers, the busiest server's main-thread CPU, and from it the
calls/s the deployment would carry were its busiest primary saturated; then both idle: commands per second
over their servers. The configurations take turns, round after round; each figure is the median of its
rounds.

    .venv/bin/python -m benchmarks.run --shards-only
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from benchmarks.harness import processes
from benchmarks.harness.constants import MANY_TENANTS, RAW_CONCURRENCY
from benchmarks.harness.load import tenants_burst
from benchmarks.harness.meter import Counters, Meter
from worker.dev.embedded import free_port, server_binary

ONE, THREE = "one Redis (reference)", "three shards"
SHARDS = 3


@contextmanager
def servers(count: int) -> Iterator[list[str]]:
    """`count` servers in a temporary directory; yields their URLs."""
    with tempfile.TemporaryDirectory() as tmp:
        ports = [free_port() for _ in range(count)]
        processes = []
        for port in ports:
            argv = [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", ""]
            processes.append(subprocess.Popen([*argv, "--appendonly", "no"], stdout=subprocess.DEVNULL))
        try:
            yield [f"redis://127.0.0.1:{port}/0" for port in ports]
        finally:
            for process in processes:
                process.terminate()
                process.wait(10)


def run(calls: int, rounds: int, idle_s: float) -> dict[str, Any]:
    tenants = [f"t{i}" for i in range(MANY_TENANTS)]
    measured: dict[str, list[dict[str, float]]] = {}
    with servers(1 + SHARDS) as urls, ExitStack() as stack:
        reference, shard_urls = urls[0], urls[1:]
        shards = " ".join(f"s{i}={url}" for i, url in enumerate(shard_urls, start=1))
        upstream = stack.enter_context(processes.upstream(0.0, 1024))
        pids = {
            ONE: stack.enter_context(
                processes.toolworker(reference, upstream.url, 64, RAW_CONCURRENCY, processes=SHARDS)
            ),
            THREE: stack.enter_context(
                processes.toolworker(
                    shard_urls[0], upstream.url, 64, RAW_CONCURRENCY,
                    extra_env={"TOOLWORKER_REDIS_SHARDS": shards},
                )
            ),
        }  # fmt: skip
        counters = {ONE: [Counters(reference)], THREE: [Counters(url) for url in shard_urls]}
        given = {ONE: None, THREE: shards}  # the client's `shards=`: None for the one Redis
        for name in (ONE, THREE):  # every process of each has taken something (a warm-up burst)
            asyncio.run(tenants_burst(reference, MANY_TENANTS * 4, tenants, given[name]))
        for number in range(rounds):
            for name in [ONE, THREE] if number % 2 == 0 else [THREE, ONE]:
                figures = _burst(counters[name], pids[name], calls, tenants, reference, given[name])
                measured.setdefault(name, []).append(figures)
                print(f"  shards: {name}: {figures['calls_per_s']:.0f} calls/s", file=sys.stderr, flush=True)
            time.sleep(1.0)  # the last settlements and events are out
            idle = {name: _idle(counters[name], idle_s) for name in (ONE, THREE)}
            for name, per_s in idle.items():
                measured[name][-1]["idle_commands_per_s"] = per_s
        for group in counters.values():
            for counter in group:
                counter.close()
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in measured.items()}
    return {"calls": calls, "rounds": rounds, "idle_s": idle_s, **medians}


def _burst(
    counters: list[Counters], pid: int, calls: int, tenants: list[str], url: str, shards: str | None
) -> dict[str, float]:
    before = [counter.read() for counter in counters]
    with Meter(pid) as meter:
        seconds = asyncio.run(tenants_burst(url, calls, tenants, shards))
    after = [counter.read() for counter in counters]
    commands = sum(a[0] - b[0] - 2 for a, b in zip(after, before, strict=True))  # less each reading's INFO pair
    main_s = [a[1] - b[1] for a, b in zip(after, before, strict=True)]
    busiest_us = max(main_s) * 1e6 / calls
    return {
        "calls_per_s": calls / seconds,
        "commands_per_call": commands / calls,
        "redis_main_thread_us_per_call": sum(main_s) * 1e6 / calls,
        "busiest_main_thread_us_per_call": busiest_us,
        "ceiling_calls_per_s": 1e6 / busiest_us if busiest_us else float("inf"),
        "worker_cpu_ms_per_call": meter.cpu_s * 1000 / calls,
    }


def _idle(counters: list[Counters], idle_s: float) -> float:
    before = [counter.read()[0] for counter in counters]
    time.sleep(idle_s)
    after = [counter.read()[0] for counter in counters]
    return sum(a - b - 2 for a, b in zip(after, before, strict=True)) / idle_s


def print_section(results: dict[str, Any]) -> None:
    one, three = results[ONE], results[THREE]
    print(
        f"\nshards: three worker processes on one Redis, then on three shards; 0 ms upstream, 1 KB;"
        f" {results['calls']} calls a burst over {MANY_TENANTS} tenants, {results['idle_s']:g} s idle;"
        f" medians of {results['rounds']} rounds"
    )
    print(
        f"  {'':<22} {'calls/s':>8} {'cmds/call':>10} {'Redis main µs/call':>19} {'busiest µs/call':>16}"
        f" {'ceiling calls/s':>16} {'worker CPU ms/call':>19} {'idle cmds/s':>12}"
    )
    for name, row in ((ONE, one), (THREE, three)):
        print(
            f"  {name:<22} {row['calls_per_s']:>8.0f} {row['commands_per_call']:>10.2f}"
            f" {row['redis_main_thread_us_per_call']:>19.1f} {row['busiest_main_thread_us_per_call']:>16.1f}"
            f" {row['ceiling_calls_per_s']:>16,.0f} {row['worker_cpu_ms_per_call']:>19.3f}"
            f" {row['idle_commands_per_s']:>12.1f}"
        )
    print(
        f"  three shards / one Redis: calls/s {three['calls_per_s'] / one['calls_per_s']:.2f},"
        f" ceiling {three['ceiling_calls_per_s'] / one['ceiling_calls_per_s']:.2f}"
    )
