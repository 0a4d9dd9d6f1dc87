"""The fair take against the take before tenants, in the same run.

Two workers are compared: this tree's (the fair take over per-tenant lists, fair turns) and a checkout of
the last commit before tenants (`--reference-tree`, else extracted from git at REFERENCE_COMMIT), one FIFO
per queue. This process's client drives both; calls for the reference carry no tenant (it has none).

- calls/s and the worker's CPU per call: a burst of calls (0 ms upstream, 1 KB) from one tenant, and
  spread over 100 tenants (each tenant's calls then leave in batches of their own); the configurations
  take turns, round after round, and each figure is the median of its rounds;
- Redis commands per call (`INFO commandstats`, every command the server ran, those inside scripts too),
  in the bursts and for calls made one at a time, and those calls' p50 (what an idle fleet adds);
- head of line: two worker processes, an upstream that answers in 200 ms with max_concurrency 16; tenant
  A enqueues a burst, tenant B then calls every 200 ms until A's burst is answered: B's p50 and p99, and
  how long A's burst took.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness import processes
from benchmarks.harness.constants import CALL_TIMEOUT_S, MANY_TENANTS, RAW_CONCURRENCY, ROOT, TOOL
from benchmarks.harness.figures import Target
from benchmarks.harness.load import tenants_burst
from benchmarks.harness.meter import Meter
from worker.client import AsyncToolClient

REFERENCE_COMMIT = "98c61cd"  # the last commit before tenants
FAIR = "fair take"
TODAY = "take before tenants"
HOL_LATENCY_MS = 200.0
HOL_MAX_CONCURRENCY = 16
HOL_INTERVAL_S = 0.2
SEQUENTIAL_CALLS = 300


@contextmanager
def reference_tree(given: Path | None) -> Iterator[Path]:
    """The reference checkout: the one given, else REFERENCE_COMMIT extracted from this repository."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="toolworker-reference-") as tmp:
        archive = Path(tmp) / "tree.tar"
        subprocess.run(["git", "archive", "-o", str(archive), REFERENCE_COMMIT], cwd=ROOT, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def run(redis_url: str, calls: int, rounds: int, hol_burst: int, reference: Path | None = None) -> dict[str, Any]:
    """Every configuration once per round, in turn; then the head-of-line case for each."""
    measured: dict[str, list[dict[str, float]]] = {}
    with reference_tree(reference) as tree, processes.upstream(0.0, 1024) as upstream:
        configs = [(FAIR, ROOT), (TODAY, tree)]
        for number in range(rounds):
            for name, root in configs[number % 2 :] + configs[: number % 2]:
                measured.setdefault(name, []).append(_throughput(redis_url, upstream.url, calls, name, root))
                print(f"  tenants: {name}: {measured[name][-1]}", file=sys.stderr, flush=True)
        with processes.upstream(HOL_LATENCY_MS, 1024) as slow:
            hol = {name: _head_of_line(redis_url, slow.url, hol_burst, name, root) for name, root in configs}
    return {"calls": calls, "rounds": rounds, "rows": _rows(measured), "head_of_line": hol, "burst": hol_burst}


def _throughput(redis_url: str, upstream_url: str, calls: int, name: str, root: Path) -> dict[str, float]:
    fair = name == FAIR
    figures: dict[str, float] = {}
    with processes.toolworker(redis_url, upstream_url, 64, RAW_CONCURRENCY, tree=root) as pid:
        for label, tenants in (("one tenant", 1), (f"{MANY_TENANTS} tenants", MANY_TENANTS)):
            names = [f"t{i}" for i in range(tenants)] if fair else ["default"]
            with _commands(redis_url) as counted, Meter(pid) as meter:
                seconds = asyncio.run(tenants_burst(redis_url, calls, names))
            figures[f"{label} calls/s"] = calls / seconds
            figures[f"{label} worker CPU ms/call"] = meter.cpu_s * 1000 / calls
            figures[f"{label} commands/call"] = counted["total"] / calls
        with _commands(redis_url) as counted:
            latencies = asyncio.run(_one_at_a_time(redis_url, SEQUENTIAL_CALLS, "t0" if fair else "default"))
        figures["one at a time commands/call"] = counted["total"] / SEQUENTIAL_CALLS
        figures["one at a time p50 ms"] = statistics.median(latencies) * 1000
    return figures


@contextmanager
def _commands(redis_url: str) -> Iterator[dict[str, int]]:
    """Commands the server ran during the block (INFO commandstats, reset before)."""
    counted = {"total": 0}
    client = redis.Redis.from_url(redis_url)
    try:
        client.config_resetstat()
        yield counted
        stats: Any = client.info("commandstats")
        counted["total"] = sum(int(v["calls"]) for k, v in stats.items() if k not in {"cmdstat_info"})
    finally:
        client.close()


async def _one_at_a_time(redis_url: str, calls: int, tenant: str) -> list[float]:
    """Each call's time from submission to envelope, the fleet idle in between (0 ms upstream)."""
    client = AsyncToolClient(redis_url, tenant=tenant)
    latencies = []
    try:
        for i in range(calls):
            started = time.perf_counter()
            await client.acall(TOOL, {"i": i}, timeout=CALL_TIMEOUT_S)
            latencies.append(time.perf_counter() - started)
    finally:
        await client.aclose()
    return latencies


def _head_of_line(redis_url: str, upstream_url: str, burst: int, name: str, root: Path) -> dict[str, float]:
    fair = name == FAIR
    with processes.toolworker(redis_url, upstream_url, 64, HOL_MAX_CONCURRENCY, processes=2, tree=root):
        latencies, burst_s = asyncio.run(_a_and_b(redis_url, burst, fair))
    ordered = sorted(latencies)
    figures = {
        "b_calls": float(len(ordered)),
        "b_p50_s": _percentile(ordered, 0.50),
        "b_p99_s": _percentile(ordered, 0.99),
        "a_burst_s": burst_s,
    }
    print(f"  tenants: head of line, {name}: {figures}", file=sys.stderr, flush=True)
    return figures


async def _a_and_b(redis_url: str, burst: int, fair: bool) -> tuple[list[float], float]:
    a = AsyncToolClient(redis_url, tenant="a" if fair else "default")
    b = AsyncToolClient(redis_url, tenant="b" if fair else "default")
    try:
        started = time.perf_counter()
        a_burst = asyncio.create_task(a.acall_many([(TOOL, {"i": i}) for i in range(burst)], timeout=600))
        await asyncio.sleep(1.0)  # B starts a second after A's burst

        async def one(i: int) -> float:
            sent = time.perf_counter()
            await b.acall(TOOL, {"i": i}, timeout=600)
            return time.perf_counter() - sent

        calls = []
        while not a_burst.done():
            calls.append(asyncio.create_task(one(len(calls))))
            await asyncio.sleep(HOL_INTERVAL_S)
        await a_burst
        burst_s = time.perf_counter() - started
        return list(await asyncio.gather(*calls)), burst_s
    finally:
        await a.aclose()
        await b.aclose()


def _percentile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else 0.0


def _rows(measured: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in measured.items()}
    today = medians[TODAY]
    return [
        {"case": name, **{k: round(v, 3) for k, v in m.items()}}
        | {f"{k} ratio": round(v / today[k], 3) for k, v in m.items() if k.endswith(("calls/s", "CPU ms/call"))}
        for name, m in medians.items()
    ]


def targets(results: dict[str, Any]) -> list[Target]:
    """The issue's targets: calls/s against the take before tenants, and the head-of-line figures."""
    fair = next(row for row in results["rows"] if row["case"] == FAIR)
    found = []
    for label, share in (("one tenant", 0.95), (f"{MANY_TENANTS} tenants", 0.90)):
        ratio = fair[f"{label} calls/s ratio"]
        found.append(Target(f"fair take, {label}: calls/s >= {share:.0%} of before", f"{ratio:.0%}", ratio >= share))
    hol, before = results["head_of_line"][FAIR], results["head_of_line"][TODAY]
    shown = f"p99 {hol['b_p99_s']:.2f} s (before: {before['b_p99_s']:.2f} s)"
    found.append(Target("head of line: B's p99 <= 1 s", shown, hol["b_p99_s"] <= 1.0))
    slower = hol["a_burst_s"] / before["a_burst_s"]
    found.append(Target("head of line: A's burst <= 110% of before", f"{slower:.0%}", slower <= 1.10))
    return found


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\ntenants: the fair take against the take before tenants; {results['calls']} calls a burst (0 ms, 1 KB, one "
        f"worker process), medians of {results['rounds']} rounds; ratios of the take before tenants"
    )
    for row in results["rows"]:
        print("  " + ", ".join(f"{k}: {v}" for k, v in row.items()))
    print(
        f"  head of line (2 worker processes, {HOL_LATENCY_MS:g} ms upstream, max_concurrency {HOL_MAX_CONCURRENCY}; "
        f"A: {results['burst']} calls, B: a call every {HOL_INTERVAL_S:g} s):"
    )
    for name, hol in results["head_of_line"].items():
        print(
            f"    {name}: B p50 {hol['b_p50_s']:.3f} s, p99 {hol['b_p99_s']:.3f} s over {hol['b_calls']} calls; "
            f"A's burst {hol['a_burst_s']:.1f} s"
        )
