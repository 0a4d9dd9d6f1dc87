"""The processes a scenario starts, each as a context manager that stops it: a Redis-compatible server,
the benchmark upstream, the toolworker worker and gateway, and the hand-written baseline."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import redis

from benchmarks.harness.baseline import QUEUE, REDIS_URL_VARIABLE, configure, fetch
from benchmarks.harness.constants import CACHED_TOOL, ROOT, START_TIMEOUT_S, STOP_TIMEOUT_S, TOOL
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis, free_port


@contextmanager
def embedded_redis() -> Iterator[EmbeddedRedis]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            yield server
        finally:
            server.stop()


def flush(redis_url: str) -> None:
    """Empty the server: every case starts on an empty Redis."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushall()
    finally:
        client.close()


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
    """The benchmark upstream in a process of its own (benchmarks/harness/upstream.py)."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.harness.upstream", "--port", str(port)]
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
def gateway(redis_url: str, definitions: Path, **settings: str) -> Iterator[tuple[str, int]]:
    """`toolworker gateway` on a free loopback port (no tokens unless `settings` name some); yields its URL
    and pid once it answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
    env |= {
        "TOOLWORKER_REDIS_URL": redis_url,
        "TOOLWORKER_DEFINITIONS": str(definitions),
        "TOOLWORKER_LOG_LEVEL": "WARNING",
        **settings,
    }
    argv = [sys.executable, "-m", "worker", "gateway", "--port", str(port)]
    with tempfile.TemporaryDirectory() as tmp, process_group(argv, env, Path(tmp) / "gateway.log") as pid:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(_until_ready(url))
        yield url, pid


async def _until_ready(url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway at {url} did not become ready")
            await asyncio.sleep(0.1)


@contextmanager
def baseline_worker(redis_url: str, upstream_url: str, processes: int) -> Iterator[int]:
    """The hand-written baseline (benchmarks/harness/baseline.py) on the default prefork pool."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ) | {REDIS_URL_VARIABLE: redis_url}
        argv = [sys.executable, "-m", "celery", "-A", "benchmarks.harness.baseline", "worker", "-P", "prefork"]
        argv += ["-c", str(processes), "-Q", QUEUE, "--loglevel", "WARNING"]
        log = Path(tmp) / "baseline.log"
        with process_group(argv, env, log) as pid:
            configure(redis_url)
            warm_up = [fetch.delay(upstream_url + "/warm-up") for _ in range(processes * 2)]
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
