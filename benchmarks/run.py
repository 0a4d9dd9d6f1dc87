"""`make bench`: every section of the benchmark in one run, each section a scenario module of its own.

    python -m benchmarks.run [--quick] [--latency-ms 0,100] [--body-bytes 1024,1048576] [--NAME-only]

Starts its own Redis-compatible server and runs the sections of SECTIONS in turn (the matrix against the
raw aiohttp limit and the hand-written baseline, pipeline.py; memory under load, memory.py; then the
gateway, answers, replicas, shards, tracing, identity, the vault, cost, tenants, the console, approvals,
code mode and webhooks). A scenario module imports only benchmarks/harness/, never another scenario: a new section is
a new module and a row of SECTIONS. Results go to bench-results/<time>.json and bench-results/latest.json;
a previous latest.json is compared with.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import (
    answers,
    approvals,
    code_mode,
    console,
    cost,
    gateway,
    identity,
    mcp_upstream,
    memory,
    pipeline,
    replicas,
    shards,
    tenants,
    tracing,
    vault,
    webhooks,
    worker_cpu,
)
from benchmarks.harness.constants import CORES, FULL, KB, MB, QUICK, ROOT, Sizes
from benchmarks.harness.figures import Target, cell_label
from benchmarks.harness.processes import embedded_redis
from worker.dev.embedded import EmbeddedRedis

RESULTS_DIR = ROOT / "bench-results"
TRACING_ROUNDS = 3
# Calls a round of the approval rows (one at a time: a p50 of fewer is mostly the machine's noise).
APPROVAL_CALLS = 1000
TENANTS_ROUNDS = 3
TENANTS_BURST = 3000  # the head-of-line burst of the issue (tenant A's calls)
TENANTS_QUICK_BURST = 500
COST_ROUNDS = 3
COST_IDLE_S = (5.0, 10.0)  # quick, full


# The sections


@dataclass(frozen=True)
class Section:
    """A part of the run that `--NAME-only` runs alone: what it says while it runs, how, its printout and
    its targets."""

    name: str
    what: str
    only: str  # the help of --NAME-only
    run: Callable[[EmbeddedRedis, Sizes, argparse.Namespace], Any]
    show: Callable[[Any], None]
    targets: Callable[[Any], list[Target]] | None = None


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
        "matrix",
        "matrix",
        "only the matrix: raw aiohttp, toolworker and the baseline per upstream",
        pipeline.run,
        pipeline.print_section,
        pipeline.targets,
    ),
    Section(
        "memory",
        "memory: calls in flight, big bodies",
        "only the worker's RSS with calls in flight and with big bodies",
        memory.run,
        memory.print_section,
        memory.targets,
    ),
    Section(
        "gateway",
        "gateway: MCP and REST against the direct client",
        "only the gateway's rows (about two minutes)",
        lambda server, sizes, args: gateway.run(server.url, sizes.calls, sizes.light_calls),
        gateway.print_section,
        gateway.targets,
    ),
    Section(
        "answers",
        "answers: cache hits against misses, structured output",
        "only the cache and structured output rows",
        lambda server, sizes, args: answers.run(server.url, sizes.light_calls),
        answers.print_section,
    ),
    Section(
        "replicas",
        "replicas: MIN_REPLICAS 0 and 1",
        "only the MIN_REPLICAS rows (a few minutes)",
        lambda server, sizes, args: replicas.run(sizes.calls, sizes.light_calls, _rounds(args)),
        replicas.print_section,
    ),
    Section(
        "shards",
        "shards: three worker processes on one Redis and on three shards",
        "only the shards' rows (a few minutes)",
        lambda server, sizes, args: shards.run(sizes.calls, _rounds(args), 2.0 if args.quick else 5.0),
        shards.print_section,
    ),
    Section(
        "tracing",
        "tracing: off, 10% and 100% sampled",
        "only the tracing rows (about two minutes)",
        lambda server, sizes, args: tracing.run(server.url, sizes.calls, _rounds(args), args.reference_tree),
        tracing.print_section,
    ),
    Section(
        "identity",
        "identity: static tokens and JWT at the gateway",
        "only the gateway's JWT-against-static rows",
        lambda server, sizes, args: identity.run(server.url, sizes.calls, sizes.light_calls, _rounds(args)),
        identity.print_section,
    ),
    Section(
        "vault",
        "vault: what acting for a user adds to a call",
        "only the vault's rows (about a minute)",
        lambda server, sizes, args: vault.run(server.url, args.quick),
        vault.print_section,
    ),
    Section(
        "cost",
        "cost: commands, Redis and worker CPU per call; idle polling",
        "only the cost-per-call rows (a few minutes)",
        _cost,
        cost.print_section,
        cost.targets,
    ),
    Section(
        "worker_cpu",
        "worker CPU: a call against a raw aiohttp request",
        "only the worker CPU rows (a few minutes)",
        lambda server, sizes, args: worker_cpu.run(server.url, args.quick),
        worker_cpu.print_section,
        worker_cpu.targets,
    ),
    Section(
        "tenants",
        "tenants: the fair take against the take before tenants",
        "only the tenants' rows (a few minutes)",
        _tenants,
        tenants.print_section,
        tenants.targets,
    ),
    Section(
        "console",
        "console: the fleet page at 100 tenants",
        "only the console's fleet page (a minute)",
        lambda server, sizes, args: console.run(server.url, 100 if args.quick else console.REQUESTS),
        console.print_section,
    ),
    Section(
        "approvals",
        "approvals: the check on calls that need none",
        "only the approval check's rows (a minute)",
        lambda server, sizes, args: approvals.run(server.url, max(sizes.light_calls, APPROVAL_CALLS), _rounds(args)),
        approvals.print_section,
    ),
    Section(
        "code_mode",
        "code mode: what a model reads, gathered calls against sequential ones, a program's cost",
        "only code mode's rows (a few minutes)",
        lambda server, sizes, args: code_mode.run(server.url, args.quick),
        code_mode.print_section,
        code_mode.targets,
    ),
    Section(
        "mcp",
        "mcp upstream: through the fleet against a direct SDK session",
        "only the MCP upstream's rows (a minute)",
        lambda server, sizes, args: mcp_upstream.run(server.url, sizes.light_calls * 5, _rounds(args)),
        mcp_upstream.print_section,
        mcp_upstream.targets,
    ),
    Section(
        "webhooks",
        "webhooks: what a delivery costs a worker",
        "only the webhook delivery rows",
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
        for section in SECTIONS:
            if not only or getattr(args, f"{section.name}_only"):
                print(section.what, file=sys.stderr, flush=True)
                try:
                    results[section.name] = section.run(server, sizes, args)
                except Exception as exc:  # calls that failed under load void their section, not the run
                    print(f"  {section.name}: not measured: {exc}", file=sys.stderr, flush=True)
                    results.setdefault("failed", {})[section.name] = f"{type(exc).__name__}: {exc}"
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["load_average_after"] = os.getloadavg()[0]
    results["targets"] = [asdict(t) for t in targets(results)]
    return results


def targets(results: dict[str, Any]) -> list[Target]:
    """Each measured section's targets, and a missed one for each section that could not be measured."""
    failed = [Target(f"{name} measured", error, False) for name, error in results.get("failed", {}).items()]
    return [
        target
        for section in SECTIONS
        if section.targets is not None and results.get(section.name)
        for target in section.targets(results[section.name])
    ] + failed


# Output


def print_header(results: dict[str, Any]) -> None:
    print(f"toolworker benchmark, commit {results['commit']}, {CORES} cores, Python {results['python']}")
    before, after = results["load_average_before"], results["load_average_after"]
    print(f"load average (1 min): {before:.2f} before the run, {after:.2f} at its end (its own load included)\n")


def print_targets(found: list[Target]) -> None:
    print("\ntargets (ratios of the raw limit measured in this run)")
    for target in found:
        print(f"  [{'MET' if target.met else 'MISSED':>6}] {target.name}: {target.shown}")


# Results files


def comparable(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every figure a later run can be compared with, by a stable key (a run saved before the sections had
    keys of their own holds the matrix's and memory's figures at the top)."""
    keyed = {}
    matrix, memory_results = results.get("matrix", results), results.get("memory", results)
    for section in ("rows", "light_load"):
        for row in matrix.get(section, []):
            keyed[f"{row['case']} @ {cell_label(row)}"] = row
    for section in ("in_flight", "big_bodies"):
        if memory_results.get(section):
            keyed[section.replace("_", " ")] = memory_results[section]
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
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


# Entry


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of about two minutes")
    parser.add_argument("--latency-ms", type=_floats, default=[0.0, 100.0], help="upstream latencies, e.g. 0,100")
    parser.add_argument("--body-bytes", type=_ints, default=[KB, MB], help="upstream body sizes, e.g. 1024,1048576")
    parser.add_argument("--threads", type=int, help="worker threads (-c); default 64")
    parser.add_argument("--batch", type=int, help="calls per acall_many; default 50")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    for section in SECTIONS:
        # `code_mode` is `--code-mode-only` (argparse makes its dest code_mode_only again)
        parser.add_argument(f"--{section.name.replace('_', '-')}-only", action="store_true", help=section.only)
    parser.add_argument("--reference-tree", type=Path, help="a checkout whose worker the tracing rows compare with")
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
    for section in SECTIONS:
        if results.get(section.name):
            section.show(results[section.name])
    print_targets([Target(**t) for t in results["targets"]])
    path, previous = save(results, args.results_dir)
    if previous is not None:
        print_comparison(previous, results)
    print(f"\n{results['seconds']:.0f} s; results in {path} and {path.parent / 'latest.json'}")
    if results.get("failed"):
        sys.exit(f"not measured: {', '.join(results['failed'])}")


if __name__ == "__main__":
    main()
