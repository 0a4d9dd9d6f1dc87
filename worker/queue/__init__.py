"""Celery: the app, the tasks, the pool, the broker transport, and what serves a message on the loop."""
