"""Dead letters: recorded once per process connection, and never holding Celery's consumer for long."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from worker.queue import dead_letter
from worker.settings import get_settings


@pytest.fixture
def silent_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A loopback server that accepts connections and never answers, as the worker's Redis."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    monkeypatch.setenv("TOOLWORKER_REDIS_URL", url)
    get_settings.cache_clear()
    monkeypatch.setattr(dead_letter, "_client", None)
    yield url
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()
    get_settings.cache_clear()


def test_a_redis_that_does_not_answer_holds_the_consumer_briefly(silent_redis: str) -> None:
    """Recording a dead letter to a Redis that never answers gives up within seconds, and says so."""
    started = time.monotonic()
    with capture_logs() as logs:
        dead_letter.dead_letter("not a task message", None, b'{"x": 1}')
    assert time.monotonic() - started < 10  # a client without timeouts waited forever here
    assert [entry["event"] for entry in logs] == ["message.dead_lettered", "message.dead_letter_failed"]


def test_dead_letters_share_one_client(silent_redis: str) -> None:
    """The process's dead letters go through one client, not a new one (and connection) each."""
    assert dead_letter._redis() is dead_letter._redis()
