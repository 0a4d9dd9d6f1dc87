"""What a call costs Redis and the worker, and how many calls one Redis primary carries.

One worker process (64 threads) on this run's Redis-compatible server, a 0 ms upstream with 1 KB bodies:

- a burst of `calls` calls from one tenant, then spread over 100 tenants (each `acall` on its own; the
  client's flush groups them by tenant): calls/s, Redis commands per call (`INFO commandstats`, every
  command the server ran, those inside scripts too), Redis main-thread CPU per call (`INFO CPU`
  `used_cpu_sys_main_thread` + `used_cpu_user_main_thread`, deltas over the burst), the worker's CPU per
  call, and from the main thread's CPU the calls/s one primary would carry were it busy with nothing else;
- calls one at a time (`ToolClient.call`, the fleet idle in between): commands per call and the p50;
- an idle worker: commands per second, over a few seconds.

The configurations take turns, round after round; each figure is the median of its rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from benchmarks.harness import processes
from benchmarks.harness.constants import MANY_TENANTS, RAW_CONCURRENCY
from benchmarks.harness.figures import Target
from benchmarks.harness.load import single_sequential, tenants_burst
from benchmarks.harness.meter import Counters, Meter

ONE = "one tenant"
MANY = f"{MANY_TENANTS} tenants"
SEQUENTIAL_CALLS = 200

# The targets.
MAX_COMMANDS_ONE = 4.0
MAX_COMMANDS_MANY = 5.0
MIN_MANY_SHARE = 0.90
MAX_IDLE_COMMANDS_PER_S = 5.0
MAX_LIGHT_COMMANDS = 10.0


def run(redis_url: str, calls: int, rounds: int, idle_s: float) -> dict[str, Any]:
    """Each shape once per round; the medians."""
    measured: dict[str, list[dict[str, float]]] = {}
    counters = Counters(redis_url)
    try:
        with (
            processes.upstream(0.0, 1024) as upstream,
            processes.toolworker(redis_url, upstream.url, 64, RAW_CONCURRENCY) as pid,
        ):
            for number in range(rounds):
                shapes = [(ONE, ["default"]), (MANY, [f"t{i}" for i in range(MANY_TENANTS)])]
                for name, tenants in shapes[number % 2 :] + shapes[: number % 2]:
                    figures = _burst_figures(redis_url, counters, pid, calls, tenants)
                    measured.setdefault(name, []).append(figures)
                    print(f"  cost: {name}: {figures['calls_per_s']:.0f} calls/s", file=sys.stderr, flush=True)
                measured.setdefault("light", []).append(_light_figures(redis_url, counters))
                measured.setdefault("idle", []).append(_idle_figures(counters, idle_s))
    finally:
        counters.close()
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in measured.items()}
    return {"calls": calls, "rounds": rounds, "idle_s": idle_s, **medians}


def _burst_figures(redis_url: str, counters: Counters, pid: int, calls: int, tenants: list[str]) -> dict[str, float]:
    with counters.during() as counted, Meter(pid) as meter:
        seconds = asyncio.run(tenants_burst(redis_url, calls, tenants))
    main_us = counted["main_thread_s"] * 1e6 / calls
    return {
        "calls_per_s": calls / seconds,
        "commands_per_call": counted["commands"] / calls,
        "redis_main_thread_us_per_call": main_us,
        "primary_calls_per_s": 1e6 / main_us if main_us else float("inf"),
        "worker_cpu_ms_per_call": meter.cpu_s * 1000 / calls,
    }


def _light_figures(redis_url: str, counters: Counters) -> dict[str, float]:
    with counters.during() as counted:
        sample = single_sequential(redis_url, SEQUENTIAL_CALLS)
    return {
        "commands_per_call": counted["commands"] / SEQUENTIAL_CALLS,
        "p50_ms": statistics.median(sample.latencies_s) * 1000,
    }


def _idle_figures(counters: Counters, idle_s: float) -> dict[str, float]:
    time.sleep(1.0)  # the last call's settlement and events are out
    with counters.during() as counted:
        time.sleep(idle_s)
    return {"commands_per_s": counted["commands"] / idle_s}


def targets(results: dict[str, Any]) -> list[Target]:
    one, many, light, idle = results[ONE], results[MANY], results["light"], results["idle"]
    share = many["calls_per_s"] / one["calls_per_s"]
    at_most = [
        (f"commands per call <= {MAX_COMMANDS_ONE:g}, {ONE}", one["commands_per_call"], MAX_COMMANDS_ONE, ".2f"),
        (f"commands per call <= {MAX_COMMANDS_MANY:g}, {MANY}", many["commands_per_call"], MAX_COMMANDS_MANY, ".2f"),
        (
            f"idle worker <= {MAX_IDLE_COMMANDS_PER_S:g} commands/s",
            idle["commands_per_s"],
            MAX_IDLE_COMMANDS_PER_S,
            ".1f",
        ),
        (
            f"a call at light load <= {MAX_LIGHT_COMMANDS:g} commands",
            light["commands_per_call"],
            MAX_LIGHT_COMMANDS,
            ".1f",
        ),
    ]
    found = [Target(name, format(value, shown), value <= limit) for name, value, limit, shown in at_most]
    many_share = f"a burst over {MANY} >= {MIN_MANY_SHARE:.0%} of {ONE}'s calls/s"
    found.insert(2, Target(many_share, f"{share:.0%}", share >= MIN_MANY_SHARE))
    return found


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\ncost per call: one worker process, 0 ms upstream, 1 KB; {results['calls']} calls a burst, "
        f"{SEQUENTIAL_CALLS} one at a time, {results['idle_s']:g} s idle; medians of {results['rounds']} rounds"
    )
    print(
        f"  {'burst':<12} {'calls/s':>8} {'cmds/call':>10} {'Redis main µs/call':>19} {'one primary calls/s':>20}"
        f" {'worker CPU ms/call':>19}"
    )
    for name in (ONE, MANY):
        row = results[name]
        print(
            f"  {name:<12} {row['calls_per_s']:>8.0f} {row['commands_per_call']:>10.2f}"
            f" {row['redis_main_thread_us_per_call']:>19.1f} {row['primary_calls_per_s']:>20,.0f}"
            f" {row['worker_cpu_ms_per_call']:>19.3f}"
        )
    light, idle = results["light"], results["idle"]
    print(f"  one at a time: {light['commands_per_call']:.1f} commands/call, p50 {light['p50_ms']:.2f} ms")
    print(f"  idle worker: {idle['commands_per_s']:.1f} commands/s")
