"""The client's own bookkeeping: what it refuses before enqueuing, and what it keeps while waiting."""

from __future__ import annotations

import json

import fakeredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from worker.client import AsyncToolClient
from worker.constants import MAX_CALL_TIMEOUT_S
from worker.errors import InvalidArguments
from worker.protocol import MAX_BATCH_BYTES, parse_call, task_messages
from worker.queue.scheduler import WAKE, tenant_list


@pytest.fixture
async def client() -> AsyncToolClient:
    """A client whose Redis is an in-process fake (nothing is listening at its URL)."""
    tool_client = AsyncToolClient("redis://127.0.0.1:9/0")
    tool_client.routing.home.redis = fakeredis.aioredis.FakeRedis()
    tool_client.routing.home.reader_redis = fakeredis.aioredis.FakeRedis()
    return tool_client


@pytest.mark.parametrize("timeout", [0, -1, MAX_CALL_TIMEOUT_S + 1])
async def test_a_timeout_the_workers_would_refuse_is_refused_at_once(client: AsyncToolClient, timeout: float) -> None:
    """A timeout the workers refuse (above a day, or not positive) raises before anything is enqueued."""
    with pytest.raises(ValueError, match="timeout"):
        await client.acall("anything", {}, timeout=timeout)
    assert await client.routing.home.redis.llen("toolcalls") == 0
    await client.aclose()


async def test_a_failed_enqueue_leaves_nothing_waiting(client: AsyncToolClient) -> None:
    """Calls that could not be enqueued raise, and the client keeps no entry for them."""
    client.routing.home.redis = fakeredis.aioredis.FakeRedis(connected=False)
    with pytest.raises(RedisConnectionError):
        await client.submit_many([("a", {}), ("b", {})], timeout=5)
    assert client.replies.waiting == {}
    await client.aclose()


async def test_a_result_waited_for_in_vain_leaves_nothing_waiting(client: AsyncToolClient) -> None:
    """A wait for a result that times out raises TimeoutError and forgets the call."""
    [call_id] = await client.submit_many([("nobody_answers", {})], timeout=5)
    with pytest.raises(TimeoutError):
        await client.result(call_id, timeout=0.05)
    assert client.replies.waiting == {}
    await client.aclose()


@pytest.mark.parametrize("tenant", ["", "has space", "x" * 65, "a/b"])
async def test_a_tenant_the_workers_would_refuse_is_refused_at_once(client: AsyncToolClient, tenant: str) -> None:
    """A tenant name outside the pattern raises before anything is enqueued."""
    with pytest.raises(ValueError, match="tenant"):
        await client.acall("anything", {}, tenant=tenant)
    assert await client.routing.home.redis.llen("toolcalls") == 0
    await client.aclose()


async def test_the_call_names_its_tenant_and_principal_and_the_default_is_implicit() -> None:
    """A call for another tenant carries it (and a principal when named); the default tenant is left out."""
    tool_client = AsyncToolClient("redis://127.0.0.1:9/0", tenant="acme")
    tool_client.routing.home.redis = fakeredis.aioredis.FakeRedis()
    tool_client.routing.home.reader_redis = fakeredis.aioredis.FakeRedis()
    await tool_client.submit_many([("a", {})], timeout=5)
    await tool_client.submit_many([("b", {})], timeout=5, tenant="default", principal="ci-bot")
    raw = await tool_client.routing.home.redis.lrange("toolcalls", 0, -1)
    raw += await tool_client.routing.home.redis.lrange(tenant_list("toolcalls", "acme"), 0, -1)  # a tenant's own list
    calls = [json.loads(json.loads(item)["body"])[0][0] for item in raw if item != WAKE.encode()]
    by_tool = {call["tool"]: call for call in calls}
    assert by_tool["a"]["tenant"] == "acme" and "principal" not in by_tool["a"]
    assert "tenant" not in by_tool["b"] and by_tool["b"]["principal"] == "ci-bot"
    assert parse_call(by_tool["b"], "t").tenant == "default"
    await tool_client.aclose()


def test_a_raw_message_with_a_malformed_tenant_is_invalid() -> None:
    """A producer's tenant outside the pattern makes the call invalid (65), never another tenant's."""
    with pytest.raises(InvalidArguments, match="tenant"):
        parse_call({"tool": "a", "tenant": "no spaces allowed"}, "t")


def test_batches_are_cut_at_a_byte_budget_as_well_as_a_count() -> None:
    """A run of calls too large for one message leaves in several batches, in order, each within the
    budget; small calls still share one batch up to the count; a lone call is an execute message."""
    big = [{"callId": f"b{i}", "tool": "t", "arguments": {"x": "y" * (MAX_BATCH_BYTES // 3)}} for i in range(7)]
    small = [{"callId": f"s{i}", "tool": "t", "arguments": {}} for i in range(5)]
    bodies = [json.loads(json.loads(m)["body"])[0][0] for m in task_messages(big + small, "q", 100)]
    batches = [body if isinstance(body, list) else [body] for body in bodies]
    assert [c["callId"] for batch in batches for c in batch] == [c["callId"] for c in big + small]
    assert all(len(json.dumps(batch).encode()) <= MAX_BATCH_BYTES for batch in batches if len(batch) > 1)
    assert [len(batch) for batch in batches] == [2, 2, 2, 6]  # the small calls join the last big one
    assert [json.loads(m)["headers"]["task"] for m in task_messages(small[:1], "q", 100)] == ["toolcall.execute"]
    assert len(task_messages(small, "q", 2)) == 3  # the count still cuts


async def test_the_async_client_closes_itself_at_the_end_of_an_async_with_block() -> None:
    """`async with AsyncToolClient(...) as client:` gives the client, and leaving the block sends what was
    submitted and stops reading replies, as `with ToolClient(...)` does."""
    server = fakeredis.FakeServer()
    async with AsyncToolClient("redis://127.0.0.1:9/0") as client:
        client.routing.home.redis = fakeredis.aioredis.FakeRedis(server=server)
        client.routing.home.reader_redis = fakeredis.aioredis.FakeRedis(server=server)
        [call_id] = await client.submit_many([("a", {})], timeout=5)
        reader = client.routing.home.reader
    assert reader is not None and reader.done()
    [raw] = await fakeredis.aioredis.FakeRedis(server=server).lrange("toolcalls", 0, -1)
    assert json.loads(json.loads(raw)["body"])[0][0]["callId"] == call_id
