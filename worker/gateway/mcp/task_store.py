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
from redis.exceptions import WatchError

TASK_KEY_PREFIX = "toolworker:gateway:task:"
PRINCIPAL_TASKS_PREFIX = "toolworker:gateway:tasks:"
# 128 random bits, as 32 hex digits: a task id cannot be guessed (SEP-2663), and it is a usable callId.
TASK_ID_BYTES = 16

StoredStatus = Literal["working", "input_required", "cancelled"]
# Where a page of a principal's tasks ended: the last one's creation time (its score) and id.
Cursor = tuple[float, str]


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
        """The task with `changes` (and a new lastUpdatedAt), applied to what is stored now (another gateway
        may have changed it since `record` was read) and written back with the TTL it had left. `cancelled`
        is final: a cancelled task is returned unchanged."""
        key = TASK_KEY_PREFIX + record.task_id
        async with self._client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    current = record if raw is None else TaskRecord.model_validate_json(raw)
                    if raw is None or current.status == "cancelled":
                        return current
                    updated = current.model_copy(update={**changes, "last_updated_at": now_iso()})
                    pipe.multi()
                    pipe.set(key, updated.model_dump_json(), keepttl=True, xx=True)
                    await pipe.execute()
                    return updated
                except WatchError:
                    continue

    async def page(self, principal: str, after: Cursor | None, limit: int) -> tuple[list[TaskRecord], Cursor | None]:
        """The principal's tasks by creation time (ties by id), those after the `after` cursor; and the cursor to
        continue from when more follow."""
        index = PRINCIPAL_TASKS_PREFIX + principal
        start = 0
        if after is not None:
            rank = await self._client.zrank(index, after[1])
            start = rank + 1 if isinstance(rank, int) else int(await self._client.zcount(index, "-inf", after[0]))
        rows: list[Any] = await self._client.zrange(index, start, start + limit, withscores=True)
        found: list[TaskRecord] = []
        gone: list[Any] = []
        for position, (member, _) in enumerate(rows[:limit]):
            record = await self.get(_text(member), principal)
            if record is not None:
                found.append(record)
            elif position < limit - 1:  # the page's last id stays: the next page starts after it
                gone.append(member)
        if gone:
            await self._client.zrem(index, *gone)
        if len(rows) <= limit or limit <= 0:
            return found, None
        member, score = rows[limit - 1]
        return found, (float(score), _text(member))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
