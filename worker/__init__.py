"""toolworker: executes LLM agents' HTTP tool calls from a Redis queue on Celery workers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.client import AsyncToolClient, CallHandle, ToolClient
    from worker.envelope import ToolResult
    from worker.errors import RedisLost, TenantQueueFull

__all__ = ["AsyncToolClient", "CallHandle", "RedisLost", "TenantQueueFull", "ToolClient", "ToolResult"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the worker's modules should not pull in the client.
    if name in {"AsyncToolClient", "CallHandle", "ToolClient"}:
        from worker import client

        return getattr(client, name)
    if name == "ToolResult":
        from worker.envelope import ToolResult

        return ToolResult
    if name == "RedisLost":
        from worker.errors import RedisLost

        return RedisLost
    if name == "TenantQueueFull":
        from worker.errors import TenantQueueFull

        return TenantQueueFull
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
