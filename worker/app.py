"""`celery -A worker.app worker` and `celery -A worker.app flower`: the Celery app, at its documented path."""

from worker.queue.app import app

__all__ = ["app"]
