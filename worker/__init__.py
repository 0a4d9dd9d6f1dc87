"""toolworker: executes LLM agents' HTTP tool calls from a Redis queue on Celery workers."""
