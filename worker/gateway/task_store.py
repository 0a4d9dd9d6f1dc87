"""The MCP tasks' shared state: one Redis record per task, so that any gateway process answers for it.

A task is a queued call: its id is the call's callId (128 random bits, made by the gateway), and its
outcome is the call's envelope, stored by the worker under that callId like any other. The record adds
what the envelope does not say: who created the task (only that principal may read or cancel it), when,
for how long it is kept (the key's expiry is the task's TTL), and the states before an envelope exists:

- `working`: the call waits in its queue or runs;
- `input_required`: the task waits for answers to `inputRequests` (an approval asked through
  elicitation); `answer` stores them and puts the task back to `working`;
- `cancelled`: the call was withdrawn before a worker took it (it was never sent upstream).

`completed` and `failed` are never stored: they are read from the envelope (tasks.py).

Keys (this module owns them): `toolworker:gateway:task:<taskId>` (the record, as JSON, expiring with the
task) and `toolworker:gateway:tasks:<principal>` (a sorted set of the principal's task ids by creation
time, for `tasks/list`; ids whose record expired are dropped as they are met).
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any, Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, ValidationError

TASK_KEY_PREFIX = "toolworker:gateway:task:"
PRINCIPAL_TASKS_PREFIX = "toolworker:gateway:tasks:"
# 128 random bits, as 32 hex digits: a task id cannot be guessed (SEP-2663), and it is a usable callId.
TASK_ID_BYTES = 16

StoredStatus = Literal["working", "input_required", "cancelled"]


class TaskRecord(BaseModel):
    task_id: str
    principal: str
    tenant: str
    tool: str
    created_at: str
    last_updated_at: str
    ttl_ms: int
    poll_interval_ms: int
    status: StoredStatus = "working"
    status_message: str | None = None
    # Outstanding requests to the client (`input_required`), keyed by the server's names for them.
    input_requests: dict[str, Any] | None = None
    # The answers `tasks/update` delivered, for whoever waits on them (approvals).
    input_responses: dict[str, Any] | None = None


def new_task_id() -> str:
    return secrets.token_hex(TASK_ID_BYTES)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TaskStore:
    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client

    async def create(self, record: TaskRecord) -> None:
        """Store a new task, expiring after its TTL, and index it under its principal."""
        created_ms = int(time.time() * 1000)
        index = PRINCIPAL_TASKS_PREFIX + record.principal
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.set(TASK_KEY_PREFIX + record.task_id, record.model_dump_json(), px=record.ttl_ms)
            pipe.zadd(index, {record.task_id: created_ms})
            pipe.zremrangebyscore(index, "-inf", created_ms - record.ttl_ms - 86_400_000)
            pipe.pexpire(index, record.ttl_ms + 86_400_000, gt=True)
            await pipe.execute()

    async def delete(self, task_id: str) -> None:
        await self._client.delete(TASK_KEY_PREFIX + task_id)

    async def get(self, task_id: str, principal: str) -> TaskRecord | None:
        """The task, if it exists and `principal` created it (else None: another's task is not found)."""
        raw = await self._client.get(TASK_KEY_PREFIX + task_id)
        if raw is None:
            return None
        try:
            record = TaskRecord.model_validate_json(raw)
        except ValidationError:
            return None
        return record if secrets.compare_digest(record.principal, principal) else None

    async def update(self, record: TaskRecord, **changes: Any) -> TaskRecord:
        """The record with `changes` (and a new lastUpdatedAt), written back with the TTL it had left."""
        updated = record.model_copy(update={**changes, "last_updated_at": now_iso()})
        await self._client.set(TASK_KEY_PREFIX + record.task_id, updated.model_dump_json(), keepttl=True, xx=True)
        return updated

    async def page(self, principal: str, after: float | None, limit: int) -> tuple[list[TaskRecord], float | None]:
        """The principal's tasks by creation time, those created after `after` (a score); and the score to
        continue from when more follow."""
        index = PRINCIPAL_TASKS_PREFIX + principal
        low = "-inf" if after is None else f"({after}"
        rows: list[Any] = await self._client.zrangebyscore(index, low, "+inf", start=0, num=limit + 1, withscores=True)
        found: list[TaskRecord] = []
        gone: list[Any] = []
        for member, _ in rows[:limit]:
            task_id = member.decode() if isinstance(member, bytes) else str(member)
            record = await self.get(task_id, principal)
            if record is None:
                gone.append(member)
            else:
                found.append(record)
        if gone:
            await self._client.zrem(index, *gone)
        more = len(rows) > limit
        return found, (rows[limit - 1][1] if more and limit > 0 else None)
