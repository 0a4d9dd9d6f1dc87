"""The health check: a Celery ping through the broker, one line of answer, bounded in time."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import WorkerProcess
from tests.support.servers import closed_port
from worker.dev.embedded import EmbeddedRedis
from worker.queue.health import check
from worker.redaction import mask_url

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def idle_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A Redis-compatible server that no worker consumes from."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("idle-redis")).start()
    yield server
    server.stop()


def _assert_one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message


def test_healthy_with_a_running_worker(worker: WorkerProcess) -> None:
    """A running worker answers the ping: True, with the name of the worker that answered."""
    started = time.monotonic()
    healthy, message = check(worker.redis_url, timeout_s=10.0)
    assert healthy, message
    assert "test-" in message and "answered" in message
    assert time.monotonic() - started < 5  # the first answer ends the wait
    _assert_one_line(message)


def test_a_named_node_must_answer(worker: WorkerProcess) -> None:
    """With a node name, only that worker counts: a name nobody has is unhealthy within the timeout."""
    healthy, message = check(worker.redis_url, timeout_s=1.0, node="nobody@nowhere")
    assert not healthy
    assert "nobody@nowhere" in message
    _assert_one_line(message)


def test_no_worker_is_unhealthy_within_the_timeout(idle_redis: EmbeddedRedis) -> None:
    """A reachable broker with no worker: False after about the timeout, not later."""
    started = time.monotonic()
    healthy, message = check(idle_redis.url, timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert not healthy
    assert 1.0 <= elapsed < 4.0
    assert message.startswith("no answer to a ping") and idle_redis.url in message
    _assert_one_line(message)


def test_closed_port_is_one_line_not_a_traceback() -> None:
    """Nothing listening: False at once, one line naming the URL, its password masked."""
    url = f"redis://:hunter2@127.0.0.1:{closed_port()}/0"
    started = time.monotonic()
    healthy, message = check(url, timeout_s=5.0)
    assert not healthy
    assert time.monotonic() - started < 5.0
    assert message.startswith("cannot reach the broker at redis://:***@127.0.0.1:")
    assert "hunter2" not in message
    _assert_one_line(message)


@pytest.mark.parametrize(
    ("url", "start"),
    [
        ("http://127.0.0.1:6379/0", "not a Redis URL"),
        ("", "not a Redis URL"),
        ("localhost:6379", "not a Redis URL"),
        ("redis://127.0.0.1:6379/not-a-number", "cannot reach the broker"),
    ],
)
def test_wrong_urls_are_one_line(url: str, start: str) -> None:
    """A URL that cannot be a broker is refused in one line, without a connection attempt or a traceback."""
    healthy, message = check(url, timeout_s=1.0)
    assert not healthy
    assert message.startswith(start)
    _assert_one_line(message)


def test_safe_url_masks_every_password() -> None:
    """Passwords are masked, also in a `;`-separated Sentinel list; a URL without one is unchanged."""
    assert mask_url("redis://user:pw@h:6379/0") == "redis://user:***@h:6379/0"
    assert (
        mask_url("sentinel://:a@h1:26379;sentinel://:b@h2:26379") == "sentinel://:***@h1:26379;sentinel://:***@h2:26379"
    )
    assert mask_url("redis://h:6379/0") == "redis://h:6379/0"
