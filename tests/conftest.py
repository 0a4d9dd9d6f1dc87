"""Fixtures: a clean environment for every test; real servers and a real worker for integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.servers import DnsServer, ServerThread, UpstreamState, closed_port, make_upstream
from tests.support.waiting import POLL_S, Budget, scaled, wait_until
from worker.client import ToolClient
from worker.dev.embedded import EmbeddedRedis
from worker.settings import get_settings

FIXTURES = Path(__file__).parent / "fixtures"
# Fixtures of shared stacks, for every module that asks for them: the gateway's (tests/support/gateway_stack.py),
# the fault tests' misbehaving upstreams (tests/support/faults.py) and Redis Sentinel's (tests/support/sentinel.py);
# timeouts counted by the machine's load (tests/support/timeouts.py), the suite's spread over xdist's
# processes (tests/support/distribution.py) and unit tests kept from starting processes (tests/support/processes.py).
pytest_plugins = [
    "tests.support.gateway_stack",
    "tests.support.faults",
    "tests.support.sentinel",
    "tests.support.timeouts",
    "tests.support.distribution",
    "tests.support.processes",
]
SECRET_TOKEN = "s3cr3t-env-token-4242"
# Hypothesis's deadline (200 ms an example) is a speed target, and those belong in benchmarks: on a machine
# busy with other work (or the suite's own processes) it failed examples that pass.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Strip TOOLWORKER_*, OTEL_* and proxy variables so no test depends on the machine's settings (nor
    sends spans to a collector of the machine's)."""
    for name in list(os.environ):
        proxy = name.lower() in {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
        if name.startswith(("TOOLWORKER_", "OTEL_")) or proxy:
            monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@dataclass
class Upstream:
    url: str
    state: UpstreamState


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    state = UpstreamState()
    server = ServerThread(make_upstream(state)).start()
    yield Upstream(server.url, state)
    server.stop()


@pytest.fixture(scope="session")
def dns_server() -> Iterator[DnsServer]:
    server = DnsServer().start()
    yield server
    server.stop()


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    redis_url: str

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def worker_env(redis_url: str, upstream_url: str, dns_address: str, definitions: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
    env.update(
        TOOLWORKER_REDIS_URL=redis_url,
        TOOLWORKER_DEFINITIONS=str(definitions),
        TOOLWORKER_DNS_SERVERS=dns_address,
        TOOLWORKER_CONCURRENCY="8",
        TOOLWORKER_METRICS_PORT="0",
        TEST_UPSTREAM_URL=upstream_url,
        TEST_SECRET_TOKEN=SECRET_TOKEN,
        TEST_CLOSED_URL=f"http://127.0.0.1:{closed_port()}",
    )
    return env


def start_worker(env: dict[str, str], log_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "worker", "worker", "-n", f"test-{uuid.uuid4().hex[:8]}@%h", *extra]
    with log_path.open("ab") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(process: subprocess.Popen[bytes], log_path: Path, processes: int = 1, timeout_s: float = 60) -> None:
    """Until the worker's log says each of its `processes` (one per shard) is ready to take calls."""

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}: {log_tail(log_path)}")
        return log_path.exists() and log_path.read_text(errors="replace").count(" ready.") >= processes

    wait_until(ready, timeout_s, f"{processes} worker processes ready ({log_path})")


def log_tail(log_path: Path, chars: int = 3000) -> str:
    return log_path.read_text(errors="replace")[-chars:] if log_path.exists() else ""


def stop_worker(process: subprocess.Popen[bytes], budget_s: float = 20.0) -> None:
    """A warm shutdown (the calls in flight finish and are acknowledged), the process killed once `budget_s`
    of an idle machine's time is spent: on a busy machine a shutdown takes longer, and a kill would end the
    calls still in flight there with an error."""
    process.terminate()
    budget = Budget(budget_s)
    while process.poll() is None and not budget.exhausted():
        time.sleep(POLL_S)
    if process.poll() is None:
        process.kill()
    process.wait()


@pytest.fixture(scope="session")
def worker(
    redis_server: EmbeddedRedis,
    upstream: Upstream,
    dns_server: DnsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    env = worker_env(redis_server.url, upstream.url, dns_server.address, FIXTURES / "integration")
    process = start_worker(env, log_path)
    handle = WorkerProcess(process, log_path, redis_server.url)
    wait_ready(process, log_path)
    with ToolClient(redis_server.url) as client:
        first = client.call("echo_get", {"item": "warm-up"}, timeout=scaled(60))
    assert first.exit_code == 0, (first.to_dict(), handle.log_text()[-3000:])
    yield handle
    stop_worker(process)


@pytest.fixture
def client(worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(worker.redis_url) as tool_client:
        yield tool_client
