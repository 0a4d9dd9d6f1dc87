"""The MCP task store at its seam (fakeredis): ownership, expiry, updates applied to the stored record, paging."""

from __future__ import annotations

import fakeredis

from worker.gateway.mcp.task_store import TASK_KEY_PREFIX, TaskRecord, TaskStore, new_task_id, now_iso


def record(principal: str = "alice", ttl_ms: int = 60_000) -> TaskRecord:
    created = now_iso()
    return TaskRecord(
        task_id=new_task_id(),
        principal=principal,
        tenant="default",
        tool="slow",
        created_at=created,
        last_updated_at=created,
        ttl_ms=ttl_ms,
        poll_interval_ms=1000,
    )


def test_task_ids_are_128_random_bits() -> None:
    """A task id is 32 hex digits, and two are never the same."""
    ids = {new_task_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(task_id) == 32 and int(task_id, 16) >= 0 for task_id in ids)


async def test_only_its_principal_reads_a_task() -> None:
    """A task is found by its principal and by nobody else; the record expires with the task's TTL."""
    client = fakeredis.FakeAsyncRedis()
    store, task = TaskStore(client), record(ttl_ms=5000)
    await store.create(task)
    assert await store.get(task.task_id, "alice") == task
    assert await store.get(task.task_id, "bob") is None
    assert 0 < await client.pttl(TASK_KEY_PREFIX + task.task_id) <= 5000


async def test_an_update_applies_to_the_stored_record_and_cancelled_is_final() -> None:
    """An update made from a stale copy keeps what another process stored; nothing changes a cancelled task."""
    store, task = TaskStore(fakeredis.FakeAsyncRedis()), record()
    await store.create(task)
    asked = await store.update(task, status="input_required", input_requests={"approval": {}})
    answered = await store.update(task, status_message="seen")  # `task` is stale: still `working`
    assert answered.status == "input_required" and answered.input_requests == {"approval": {}}
    cancelled = await store.update(asked, status="cancelled", status_message="withdrawn")
    after = await store.update(task, status="working", status_message="ran on")
    assert after == cancelled and (await store.get(task.task_id, "alice")) == cancelled


async def test_a_principals_tasks_page_in_creation_order_without_expired_ones() -> None:
    """page() gives a principal's tasks oldest first (ties by id) behind a cursor, each once, and drops ids whose
    record is gone."""
    client = fakeredis.FakeAsyncRedis()
    store = TaskStore(client)
    tasks = [record() for _ in range(7)]
    for task in tasks:
        await store.create(task)
        await store.create(record("bob"))
    index = "toolworker:gateway:tasks:alice"
    scores = [1000.0] * 4 + [2000.0, 3000.0, 4000.0]  # the first four created in the same millisecond
    await client.zadd(index, {task.task_id: score for task, score in zip(tasks, scores, strict=True)})
    await client.delete(TASK_KEY_PREFIX + tasks[4].task_id)
    expected = [*sorted(t.task_id for t in tasks[:4]), tasks[5].task_id, tasks[6].task_id]
    listed, cursor = [], None
    while True:
        page, cursor = await store.page("alice", cursor, 2)
        listed += [t.task_id for t in page]
        if cursor is None:
            break
    assert listed == expected
    assert tasks[4].task_id.encode() not in await client.zrange(index, 0, -1)
