"""Is a worker alive? A Celery ping through the broker, answered in one line (`toolworker health`)."""

from __future__ import annotations

import time

from celery import Celery
from celery.utils.nodenames import host_format
from kombu.exceptions import KombuError
from redis.exceptions import RedisError

from worker.queue.app import app
from worker.redaction import mask_url

# kombu's Redis transports; anything else cannot be this project's broker.
_SCHEMES = frozenset({"redis", "rediss", "sentinel"})
# A wrong URL, a refused or reset connection, a failed lookup, a rejected password: all mean "not healthy".
_UNREACHABLE = (KombuError, RedisError, OSError, ValueError, LookupError)


def check(redis_url: str, timeout_s: float = 5.0, node: str | None = None) -> tuple[bool, str]:
    """True when a worker (`node`, if given; `%h` is this host's name) answers a ping within `timeout_s`."""
    where = mask_url(redis_url)
    scheme = redis_url.partition("://")[0].partition("+")[0]
    if scheme not in _SCHEMES:
        return False, f"not a Redis URL: {where!r} (expected redis://, rediss:// or sentinel://)"
    destination = [host_format(node)] if node else None
    deadline = time.monotonic() + timeout_s
    probe = _probe_app(redis_url, timeout_s)
    try:
        with probe.connection_for_write() as connection:
            connection.ensure_connection(max_retries=0)
            wait_s = max(0.1, deadline - time.monotonic())
            replies = probe.control.ping(destination, timeout=wait_s, limit=1, connection=connection)
    except _UNREACHABLE as exc:
        return False, f"cannot reach the broker at {where}: {_one_line(exc)}"
    finally:
        probe.close()
    answered = sorted(name for reply in replies for name in reply)
    if not answered:
        asked = destination[0] if destination else "any worker"
        return False, f"no answer to a ping from {asked} within {timeout_s:g} s on {where}"
    return True, f"{answered[0]} answered a ping on {where}"


def nodes(redis_url: str, timeout_s: float = 1.0) -> list[str]:
    """The Celery node names of the workers that answer a ping within `timeout_s` (every one: it waits the
    whole time); raises RuntimeError saying why when the broker cannot be reached."""
    probe = _probe_app(redis_url, timeout_s)
    try:
        with probe.connection_for_write() as connection:
            connection.ensure_connection(max_retries=0)
            replies = probe.control.ping(timeout=timeout_s, connection=connection)
    except _UNREACHABLE as exc:
        raise RuntimeError(f"cannot reach the broker at {mask_url(redis_url)}: {_one_line(exc)}") from None
    finally:
        probe.close()
    return sorted(name for reply in replies for name in reply)


def _probe_app(redis_url: str, timeout_s: float) -> Celery:
    """An app on `redis_url` that speaks the worker's control protocol.

    `app.control.ping(connection=...)` still publishes through the app's own producer pool, so a ping for
    another broker needs an app of its own.
    """
    probe = Celery("toolworker-health", broker=redis_url, set_as_current=False)
    probe.conf.update(
        control_exchange=app.conf.control_exchange,
        broker_transport_options=app.conf.broker_transport_options,
        accept_content=app.conf.accept_content,
        broker_connection_timeout=timeout_s,
    )
    return probe


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
