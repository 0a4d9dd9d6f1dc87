"""Bad connection settings fail fast with the true reason: a wrong password, nothing listening."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.waiting import scaled
from worker.dev.embedded import free_port, server_binary

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-pw-0417"
BOUND_S = 10.0  # the connect timeout is 5 s; the old behaviour was 73 s to forever


def bound_s() -> float:
    """BOUND_S with the command's start-up, which a busy machine slows; never as long as the old behaviour."""
    return min(scaled(BOUND_S), 60.0)


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A Redis-compatible server of its own that wants a password."""
    port = free_port()
    directory = tmp_path_factory.mktemp("locked")
    argv = [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", ""]
    process = subprocess.Popen([*argv, "--requirepass", PASSWORD], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=PASSWORD)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
    yield port
    client.close()
    process.terminate()
    process.wait(10)


def toolworker(url: str, *argv: str) -> tuple[int, str, float]:
    """Run the CLI against `url`; its exit code, standard error and how long it took."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "OTEL_"))}
    env.update(TOOLWORKER_REDIS_URL=url, TOOLWORKER_METRICS_PORT="0", TOOLWORKER_DEFINITIONS=str(Path("definitions")))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "worker", *argv], env=env, capture_output=True, timeout=60)
    return done.returncode, done.stderr.decode(), time.monotonic() - started


@pytest.mark.parametrize("command", [["call", "ticket_lookup", "--arg", "ticket_id=1"], ["worker"], ["publish"]])
def test_a_wrong_password_says_authentication_failed(locked_server: int, command: list[str]) -> None:
    """A wrong password ends the command within seconds with 69, "authentication failed", the password masked."""
    code, stderr, took_s = toolworker(f"redis://:wrong-{PASSWORD}@127.0.0.1:{locked_server}/0", *command)
    assert code == 69 and took_s < bound_s()
    assert "authentication failed" in stderr and PASSWORD not in stderr and "***" in stderr


def test_a_missing_password_says_authentication_failed(locked_server: int) -> None:
    """No password for a server that wants one is an authentication failure too, not "unreachable"."""
    code, stderr, _ = toolworker(f"redis://127.0.0.1:{locked_server}/0", "call", "ticket_lookup")
    assert code == 69 and "authentication failed" in stderr


@pytest.mark.parametrize("command", [["call", "ticket_lookup"], ["worker"]])
def test_nothing_listening_is_said_in_one_line(command: list[str]) -> None:
    """A port where nothing listens ends the command within the connect timeout with a one-line reason."""
    code, stderr, took_s = toolworker(f"redis://127.0.0.1:{free_port()}/0", *command)
    assert code == 69 and took_s < bound_s()
    assert "cannot reach Redis at redis://127.0.0.1:" in stderr and len(stderr.strip().splitlines()) == 1
