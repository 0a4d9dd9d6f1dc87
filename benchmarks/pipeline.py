"""The pieces of the pipeline benchmark: the processes it starts and the measurements it takes.

`benchmarks/run.py` puts them together (`make bench`); `python -m benchmarks.pipeline` is the same entry.

Every measurement returns a `Sample`: how many calls, how long they took together, and for each call
the time from its submission to its result as the client saw it. A burst submits every call at once
and then collects, so its latencies include the wait in the queue; a sequential run sends one call at
a time, so its latencies are the pipeline's own overhead.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from celery.result import AsyncResult

from worker.client import AsyncToolClient, ToolClient
from worker.dev.embedded import free_port
from worker.envelope import ToolResult

ROOT = Path(__file__).resolve().parent.parent
TOOL = "bench_get"
# The same request, its answers cached (benchmarks/answers.py).
CACHED_TOOL = "bench_cached"
RAW_CONCURRENCY = 256
CALL_TIMEOUT_S = 300.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
RSS_INTERVAL_S = 0.02
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    calls: int
    seconds: float
    latencies_s: list[float]
    failures: Counter[str] = field(default_factory=Counter)
    truncated: int = 0

    def add_result(self, result: ToolResult) -> None:
        if result.exit_code:
            self.failures[f"{result.exit_code}: {(result.error or {}).get('message', '')}"[:120]] += 1
        self.truncated += result.truncated


# Processes


@dataclass(frozen=True)
class Upstream:
    url: str

    def stats(self, reset: bool = False) -> dict[str, int]:
        """Requests in flight now and at most since the last reset, as the upstream counted them."""
        query = "?reset=1" if reset else ""
        with urllib.request.urlopen(f"{self.url}/_stats{query}", timeout=10) as resp:
            stats: dict[str, int] = json.load(resp)
            return stats


@contextmanager
def upstream(latency_ms: float, body_bytes: int) -> Iterator[Upstream]:
    """The benchmark upstream in a process of its own (benchmarks/upstream.py)."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.upstream", "--port", str(port)]
    argv += ["--latency-ms", str(latency_ms), "--body-bytes", str(body_bytes)]
    with process_group(argv, dict(os.environ)):
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url)
        yield Upstream(url)


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the benchmark upstream at {url} did not start")


def definitions(directory: Path, max_concurrency: int) -> Path:
    """One GET tool on the upstream (and the same, cached); max_output_chars and max_response_bytes stay at
    their defaults."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "bench.yaml").write_text(
        "upstreams:\n"
        "  bench:\n"
        "    base_url: ${env:BENCH_UPSTREAM_URL}\n"
        f"    max_concurrency: {max_concurrency}\n"
        "tools:\n"
        f"  - name: {TOOL}\n"
        "    upstream: bench\n"
        "    input_schema: {type: object, properties: {i: {type: integer}}}\n"
        '    request: {method: GET, path: "/items/${i}"}\n'
        f"  - name: {CACHED_TOOL}\n"
        "    upstream: bench\n"
        "    input_schema: {type: object, properties: {i: {type: integer}}}\n"
        '    request: {method: GET, path: "/items/${i}"}\n'
        "    cache: {ttl_seconds: 3600}\n"
    )
    return directory


@contextmanager
def toolworker(
    redis_url: str,
    upstream_url: str,
    threads: int,
    max_concurrency: int,
    processes: int = 1,
    task_events: bool = True,
    extra_env: Mapping[str, str] | None = None,
    tree: Path = ROOT,
) -> Iterator[int]:
    """`toolworker worker -c N --processes P` serving the benchmark tool; yields its pid once every process
    answers (the pid of the supervisor when P > 1: its tree is metered). `tree`: a checkout to run the
    worker from (another commit, for an A/B)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
        env |= {
            "TOOLWORKER_REDIS_URL": redis_url,
            "TOOLWORKER_DEFINITIONS": str(definitions(Path(tmp) / "definitions", max_concurrency)),
            "TOOLWORKER_LOG_LEVEL": "WARNING",
            "TOOLWORKER_TASK_EVENTS": str(task_events).lower(),
            "BENCH_UPSTREAM_URL": upstream_url,
            **(extra_env or {}),
        }
        argv = [sys.executable, "-m", "worker", "worker", "-P", "threads", "-c", str(threads), "--loglevel", "WARNING"]
        argv += ["--processes", str(processes)]
        log = Path(tmp) / "worker.log"
        with process_group(argv, env, log, cwd=tree) as pid:
            _warm_up_toolworker(redis_url, log)
            _wait_for_nodes(redis_url, processes, log)
            yield pid


def _warm_up_toolworker(redis_url: str, log: Path) -> None:
    with ToolClient(redis_url) as client:
        result = client.call(TOOL, {"i": 0}, timeout=START_TIMEOUT_S)
    if result.exit_code:
        raise RuntimeError(f"the worker did not answer: {result.error}\n{_tail(log)}")


def _wait_for_nodes(redis_url: str, processes: int, log: Path) -> None:
    """Every worker process is consuming (answers a ping through the broker)."""
    from celery import Celery

    control = Celery(broker=redis_url).control
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(control.ping(timeout=0.5)) < processes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{processes} worker processes did not all start\n{_tail(log)}")


@contextmanager
def baseline_worker(redis_url: str, upstream_url: str, processes: int) -> Iterator[int]:
    """The hand-written baseline (benchmarks/baseline.py) on the default prefork pool."""
    from benchmarks import baseline

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ) | {baseline.REDIS_URL_VARIABLE: redis_url}
        argv = [sys.executable, "-m", "celery", "-A", "benchmarks.baseline", "worker", "-P", "prefork"]
        argv += ["-c", str(processes), "-Q", baseline.QUEUE, "--loglevel", "WARNING"]
        log = Path(tmp) / "baseline.log"
        with process_group(argv, env, log) as pid:
            baseline.configure(redis_url)
            warm_up = [baseline.fetch.delay(upstream_url + "/warm-up") for _ in range(processes * 2)]
            for pending in warm_up:
                pending.get(timeout=START_TIMEOUT_S)
            yield pid


@contextmanager
def process_group(argv: list[str], env: dict[str, str], log: Path | None = None, cwd: Path = ROOT) -> Iterator[int]:
    """A child in a session of its own, so that the whole tree (prefork children too) stops with it."""
    with (log or Path(os.devnull)).open("ab") as out:
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=out, start_new_session=True)
    try:
        yield process.pid
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# Memory


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants (children of any of its threads)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def rss_mb(pid: int) -> float:
    """Resident memory of a process tree, in MB (pages shared between processes count once per process)."""
    total_kb = 0
    for member in process_tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total_kb / 1024


def cpu_s(pid: int) -> float:
    """CPU time (user + system) used so far by a process tree's living members, in seconds."""
    ticks = 0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLOCK_TICKS


class Meter:
    """While the block runs: the highest RSS of a process tree (sampled in a thread) and its CPU time.

    Without a pid it meters this process (the raw aiohttp client): CPU only."""

    def __init__(self, pid: int | None, interval_s: float = RSS_INTERVAL_S) -> None:
        self._pid = pid
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self.max_rss_mb: float | None = None
        self.cpu_s = 0.0

    def __enter__(self) -> Meter:
        self.cpu_s = -self._cpu()
        if self._pid is not None:
            self.max_rss_mb = rss_mb(self._pid)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_s += self._cpu()
        if self._pid is not None:
            self._stop.set()
            self._thread.join(STOP_TIMEOUT_S)
            self._sample_once()

    def _cpu(self) -> float:
        return time.process_time() if self._pid is None else cpu_s(self._pid)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample_once()

    def _sample_once(self) -> None:
        assert self._pid is not None
        self.max_rss_mb = max(self.max_rss_mb or 0.0, rss_mb(self._pid))


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


def single_sequential(redis_url: str, calls: int) -> Sample:
    """ToolClient.call, one at a time."""
    with ToolClient(redis_url) as client:
        sample = Sample(calls, 0.0, [])
        started = time.perf_counter()
        for i in range(calls):
            sent = time.perf_counter()
            sample.add_result(client.call(TOOL, {"i": i}, timeout=CALL_TIMEOUT_S))
            sample.latencies_s.append(time.perf_counter() - sent)
        sample.seconds = time.perf_counter() - started
    return sample


def async_burst(redis_url: str, calls: int, batch: int) -> Sample:
    """AsyncToolClient: `acall` per call (batch 1; the client coalesces one tick's calls into batch
    messages) or `acall_many` per chunk of `batch`, all submitted at once."""
    return asyncio.run(_async_burst(redis_url, calls, batch))


async def _async_burst(redis_url: str, calls: int, batch: int) -> Sample:
    client = AsyncToolClient(redis_url)
    try:
        await client.acall(TOOL, {"i": 0}, timeout=START_TIMEOUT_S)  # the reply reader is running
        sample = Sample(calls, 0.0, [])

        async def chunk(start: int, submitted: float) -> None:
            specs = [(TOOL, {"i": i}) for i in range(start, min(calls, start + batch))]
            if batch == 1:
                results = [await client.acall(*specs[0], timeout=CALL_TIMEOUT_S)]
            else:
                results = await client.acall_many(specs, timeout=CALL_TIMEOUT_S)
            done = time.perf_counter()
            for result in results:
                sample.add_result(result)
                sample.latencies_s.append(done - submitted)

        started = time.perf_counter()
        await asyncio.gather(*(chunk(start, started) for start in range(0, calls, batch)))
        sample.seconds = time.perf_counter() - started
        return sample
    finally:
        await client.aclose()


# The hand-written baseline


def baseline_burst(upstream_url: str, calls: int) -> Sample:
    """`fetch.delay(url)` for every call, then `.get()` for each."""
    from benchmarks.baseline import fetch

    started = time.perf_counter()
    pending = [(time.perf_counter(), fetch.delay(f"{upstream_url}/items/{i}")) for i in range(calls)]
    sample = Sample(calls, 0.0, [])
    for submitted, result in pending:
        _collect_baseline(sample, result, submitted)
    sample.seconds = time.perf_counter() - started
    return sample


def baseline_sequential(upstream_url: str, calls: int) -> Sample:
    from benchmarks.baseline import fetch

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


if __name__ == "__main__":
    from benchmarks.run import main

    main()
