"""What tracing costs a worker: tracing off, and on with 10% and 100% of traces sampled.

Against one upstream (0 ms, 1 KB) and one worker process started per configuration, `AsyncToolClient`
sends bursts of calls; for each configuration the worker's CPU time per call and the calls/s. The
configurations take turns, round after round, so that drift on a shared machine touches them alike;
each figure is the median of its rounds, and the ratios are of tracing off in the same run.

With `--reference-tree PATH` (a checkout of another commit, e.g. the one before tracing), its worker
is measured in the same rounds: tracing off against code without the tracing hooks.

Spans go to an OTLP/HTTP sink in this process that decodes and counts them, so that a sampled run is
known to have exported what it should.
"""

from __future__ import annotations

import statistics
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.harness import processes
from benchmarks.harness.constants import RAW_CONCURRENCY, ROOT, UPSTREAM_BODY_BYTES, UPSTREAM_LATENCY_MS
from benchmarks.harness.load import async_burst
from benchmarks.harness.meter import Meter

OFF = "tracing off"
SAMPLED_10 = "tracing on, 10% sampled"
SAMPLED_ALL = "tracing on, every call sampled"
REFERENCE = "reference tree (tracing off)"


class Sink:
    """An OTLP/HTTP receiver on 127.0.0.1 that counts the spans exported to it."""

    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest.FromString(body)
                count = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                with sink._lock:
                    sink.spans += count
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @contextmanager
    def running(self) -> Iterator[Sink]:
        self._thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()

    def take(self) -> int:
        with self._lock:
            spans, self.spans = self.spans, 0
        return spans


def configurations(sink_url: str, reference: Path | None) -> list[tuple[str, dict[str, str], Path]]:
    exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink_url, "OTEL_BSP_SCHEDULE_DELAY": "1000"}
    tenth = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    found = [
        (OFF, {}, ROOT),
        (SAMPLED_10, exporting | tenth, ROOT),
        (SAMPLED_ALL, exporting | {"OTEL_TRACES_SAMPLER": "always_on"}, ROOT),
    ]
    if reference is not None:
        found.append((REFERENCE, {}, reference))
    return found


def run(redis_url: str, calls: int, rounds: int, reference: Path | None = None) -> dict[str, Any]:
    """Every configuration once per round, in turn; the medians and their ratios to tracing off."""
    measured: dict[str, list[dict[str, float]]] = {}
    with Sink().running() as sink, processes.upstream(UPSTREAM_LATENCY_MS, UPSTREAM_BODY_BYTES) as upstream:
        configs = configurations(sink.url, reference)
        for number in range(rounds):
            for name, env, tree in configs[number % len(configs) :] + configs[: number % len(configs)]:
                measured.setdefault(name, []).append(_measure(redis_url, upstream.url, calls, env, tree, sink))
                last = measured[name][-1]
                print(f"  tracing: {name}: {last['worker_cpu_ms_per_call']:.3f} ms CPU/call", file=sys.stderr)
    return {"calls": calls, "rounds": rounds, "rows": _rows(measured)}


def _measure(
    redis_url: str, upstream_url: str, calls: int, env: dict[str, str], tree: Path, sink: Sink
) -> dict[str, float]:
    concurrency = RAW_CONCURRENCY
    with processes.toolworker(redis_url, upstream_url, 64, concurrency, extra_env=env, tree=tree) as pid:
        sink.take()  # the warm-up call's spans
        with Meter(pid) as meter:
            sample = async_burst(redis_url, calls, 1)
    # The worker flushed its batched spans as it stopped.
    return {
        "worker_cpu_ms_per_call": meter.cpu_s * 1000 / calls,
        "calls_per_s": calls / sample.seconds,
        "spans_per_call": sink.take() / calls,
        "failures": float(sum(sample.failures.values())),
    }


def _rows(measured: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    medians = {
        name: {key: statistics.median(run[key] for run in runs) for key in runs[0]} for name, runs in measured.items()
    }
    off = medians[OFF]
    return [
        {
            "case": name,
            "worker_cpu_ms_per_call": round(m["worker_cpu_ms_per_call"], 4),
            "cpu_ratio": round(m["worker_cpu_ms_per_call"] / off["worker_cpu_ms_per_call"], 3),
            "added_cpu_us_per_call": round((m["worker_cpu_ms_per_call"] - off["worker_cpu_ms_per_call"]) * 1000, 1),
            "calls_per_s": round(m["calls_per_s"], 1),
            "calls_per_s_ratio": round(m["calls_per_s"] / off["calls_per_s"], 3),
            "spans_per_call": round(m["spans_per_call"], 3),
            "cpu_ms_per_call_each_round": [round(r["worker_cpu_ms_per_call"], 4) for r in measured[name]],
            "failures": int(sum(r["failures"] for r in measured[name])),
        }
        for name, m in medians.items()
    ]


def print_section(results: dict[str, Any]) -> None:
    print(
        f"\ntracing: upstream {UPSTREAM_LATENCY_MS:g} ms, {UPSTREAM_BODY_BYTES // 1024} KB; one worker process; "
        f"{results['calls']} calls a round, medians of {results['rounds']} rounds; ratios of tracing off"
    )
    print(
        f"  {'case':<34} {'worker CPU ms/call':>19} {'ratio':>6} {'added µs/call':>14} {'calls/s':>8} {'ratio':>6}"
        f" {'spans/call':>11} {'fail':>5}"
    )
    for row in results["rows"]:
        print(
            f"  {row['case']:<34} {row['worker_cpu_ms_per_call']:>19.3f} {row['cpu_ratio']:>6.3f}"
            f" {row['added_cpu_us_per_call']:>+14.1f} {row['calls_per_s']:>8.0f} {row['calls_per_s_ratio']:>6.3f}"
            f" {row['spans_per_call']:>11.3f} {row['failures']:>5}"
        )
