"""What the approval check costs a call that needs no approval, at the worker, where the check runs.

One worker service (worker/queue/service.py, as a worker process builds it, on a real Redis-compatible
server) serves one call at a time of a GET tool whose upstream asks approval for DELETE only: the call
needs none, but the check looks its rule up on every call. The same calls are served with the check
(the service as built) and without it (the service's gate removed), taking turns round after round;
each figure is the median of its rounds' p50s, from the message handed to the service to its envelope
published. The upstream (benchmarks/harness/upstream.py) answers at once with 1 KB.

    .venv/bin/python -m benchmarks.approvals [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.harness import processes
from worker.dev.embedded import EmbeddedRedis
from worker.logs import configure
from worker.protocol import ToolCall
from worker.queue.service import Service, build_service
from worker.settings import Settings

CASES = ("without the approval check", "with the approval check")
TOOL = "bench_get"


def _definitions(directory: Path) -> Path:
    (directory / "bench.yaml").write_text(
        "upstreams:\n"
        "  bench:\n"
        "    base_url: ${env:BENCH_UPSTREAM_URL}\n"
        "    approval: {methods: [DELETE]}\n"
        "tools:\n"
        f"  - name: {TOOL}\n"
        "    upstream: bench\n"
        "    input_schema: {type: object, properties: {i: {type: integer}}}\n"
        '    request: {method: GET, path: "/items/${i}"}\n'
    )
    return directory


async def _p50_ms(service: Service, calls: int) -> float:
    """Calls one at a time through the service; the median time per call, in milliseconds."""
    times = []
    for i in range(calls):
        call_id = str(uuid.uuid4())
        started = time.perf_counter()
        summaries = await service.serve([{"callId": call_id, "tool": TOOL, "arguments": {"i": i}}], call_id, False)
        times.append(time.perf_counter() - started)
        assert summaries[0]["exitCode"] == 0, summaries
    return statistics.median(times) * 1000


async def _check_us(service: Service, repeat: int = 20_000) -> float:
    """The check alone, for the same call: microseconds per call (it touches no Redis for such a call)."""
    assert service.gate is not None
    call = ToolCall.model_validate({"callId": "c", "tool": TOOL, "arguments": {"i": 1}})
    started = time.perf_counter()
    for _ in range(repeat):
        assert await service.gate.hold(call, started) is None
    return (time.perf_counter() - started) / repeat * 1e6


async def _rounds(service: Service, calls: int, rounds: int) -> dict[str, list[float]]:
    gate = service.gate
    measured: dict[str, list[float]] = {case: [] for case in CASES}
    measured["check alone (us)"] = [await _check_us(service)]
    await _p50_ms(service, min(calls, 200))  # warm: pools, scripts, the validator
    for _ in range(rounds):
        for case in CASES:
            service.gate = gate if case == CASES[1] else None
            measured[case].append(await _p50_ms(service, calls))
    service.gate = gate
    return measured


def run(redis_url: str, calls: int, rounds: int) -> dict[str, Any]:
    configure("json", "WARNING")  # a log line per call would be most of what is measured
    with tempfile.TemporaryDirectory() as tmp, processes.upstream(0.0, 1024) as upstream:
        os.environ["BENCH_UPSTREAM_URL"] = upstream.url
        settings = Settings(redis_url=redis_url, definitions=_definitions(Path(tmp)), metrics_port=0)
        service = build_service(settings)
        try:
            measured = asyncio.run(_measure(service, calls, rounds))
        finally:
            os.environ.pop("BENCH_UPSTREAM_URL", None)
    check_us = round(measured.pop("check alone (us)")[0], 2)
    p50 = {case: round(statistics.median(values), 4) for case, values in measured.items()}
    added_us = round((p50[CASES[1]] - p50[CASES[0]]) * 1000, 1)
    return {
        "calls": calls,
        "rounds": rounds,
        "p50_ms": p50,
        "rounds_ms": measured,
        "added_us": added_us,
        "check_us": check_us,
    }


async def _measure(service: Service, calls: int, rounds: int) -> dict[str, list[float]]:
    try:
        return await _rounds(service, calls, rounds)
    finally:
        await service.close()


def print_section(results: dict[str, Any]) -> None:
    print(f"\napprovals: a call that needs none, one at a time ({results['calls']} calls x {results['rounds']} rounds)")
    for case, p50 in results["p50_ms"].items():
        print(f"  {case:<28} p50 {p50:8.3f} ms")
    print(f"  difference of the p50s      {results['added_us']:8.1f} us")
    print(f"  the check alone             {results['check_us']:8.2f} us a call (no Redis for such a call)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            results = run(server.url, 300 if args.quick else 2000, 1 if args.quick else args.rounds)
        finally:
            server.stop()
    print_section(results)
    json.dump(results, sys.stderr, indent=2)


if __name__ == "__main__":
    main()
