"""The baseline users write by hand: a Celery task that calls `requests`, on the default prefork pool.

Its own app on the benchmark's Redis, with a queue of its own. The worker is started as

    BASELINE_REDIS_URL=redis://… celery -A benchmarks.harness.baseline worker -P prefork -c 2 -Q baseline

and the benchmark enqueues with `fetch.delay(url)` and collects with `.get()` after `configure(url)`.
Everything else is Celery's defaults, as in a first version written by hand.
"""

from __future__ import annotations

import os
from typing import Any

import requests
from celery import Celery

QUEUE = "baseline"
REDIS_URL_VARIABLE = "BASELINE_REDIS_URL"
MAX_TEXT_CHARS = 16_000

app = Celery("baseline")


def configure(redis_url: str) -> Celery:
    """Point the app at a Redis (broker and result backend); before its first use."""
    app.conf.update(broker_url=redis_url, result_backend=redis_url, task_default_queue=QUEUE)
    return app


@app.task(name="baseline.fetch")  # type: ignore[untyped-decorator]  # Celery's decorators are untyped
def fetch(url: str) -> dict[str, Any]:
    response = requests.get(url, timeout=10)
    return {"status": response.status_code, "text": response.text[:MAX_TEXT_CHARS]}


if REDIS_URL_VARIABLE in os.environ:  # the worker process: configured by its environment
    configure(os.environ[REDIS_URL_VARIABLE])
