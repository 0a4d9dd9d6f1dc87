"""The upstream tasks calls wait on, in Redis (the home shard), so that no worker's memory is the only place
a task's id is known.

    toolworker:mcp-task:<callId>   hash: upstream, task (the server's task id), tool, session (the 2025-11-25
                                   session the task is bound to, if any), status (the server's latest status
                                   message), cancel ("1": the call was cancelled; the worker that polls sends
                                   tasks/cancel); expires a while after the call's deadline

A worker stores the record as soon as the server answers `tools/call` with a task, before it polls. A
worker given the same call again (the first was lost: its lease lapsed) finds the record and polls that
task: the tool is not called twice. A gateway cancelling a call that is already running marks the record
(`mark_cancelled`), which only ever changes a record that exists.

This module owns the key prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

KEY_PREFIX = "toolworker:mcp-task:"
# How long a record outlives its call's deadline (a redelivered call may run a while past it, answering 75).
KEEP_AFTER_DEADLINE_S = 3600

# Sets `cancel` on a record that exists, never creates one.
_MARK = "if redis.call('exists', KEYS[1]) == 1 then redis.call('hset', KEYS[1], 'cancel', '1') return 1 end return 0"


@dataclass(frozen=True, slots=True)
class UpstreamTask:
    upstream: str
    task_id: str
    tool: str
    cancel: bool = False
    status: str | None = None
    session: str | None = None


def key_of(call_id: str) -> str:
    return KEY_PREFIX + call_id


async def store(client: aioredis.Redis, call_id: str, task: UpstreamTask, ttl_s: float) -> None:
    fields = {"upstream": task.upstream, "task": task.task_id, "tool": task.tool}
    if task.session is not None:
        fields["session"] = task.session
    async with client.pipeline(transaction=True) as pipe:
        for name, value in fields.items():
            pipe.hset(key_of(call_id), name, value)
        pipe.expire(key_of(call_id), max(1, int(ttl_s)))
        await pipe.execute()


async def read(client: aioredis.Redis, call_id: str) -> UpstreamTask | None:
    raw: dict[Any, Any] = await client.hgetall(key_of(call_id))
    fields = {_text(k): _text(v) for k, v in raw.items()}
    if "task" not in fields:
        return None
    cancel = fields.get("cancel") == "1"
    upstream, tool = fields.get("upstream", ""), fields.get("tool", "")
    return UpstreamTask(upstream, fields["task"], tool, cancel, fields.get("status"), fields.get("session"))


async def cancelled(client: aioredis.Redis, call_id: str) -> bool:
    return _text(await client.hget(key_of(call_id), "cancel") or b"") == "1"


async def set_status(client: aioredis.Redis, call_id: str, message: str) -> None:
    """The server's latest status message for the task (shown as the call's task status)."""
    await client.eval(
        "if redis.call('exists', KEYS[1]) == 1 then redis.call('hset', KEYS[1], 'status', ARGV[1]) end",
        1,
        key_of(call_id),
        message,
    )


async def status(client: aioredis.Redis, call_id: str) -> str | None:
    value = await client.hget(key_of(call_id), "status")
    return None if value is None else _text(value)


async def mark_cancelled(client: aioredis.Redis, call_id: str) -> bool:
    """Ask the worker polling this call's upstream task to cancel it; False: the call waits on no task."""
    return bool(await client.eval(_MARK, 1, key_of(call_id)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
