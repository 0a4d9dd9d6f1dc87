"""The client's own bookkeeping: what it refuses before enqueuing, and what it keeps while waiting."""

from __future__ import annotations

import fakeredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from worker.client import AsyncToolClient
from worker.constants import MAX_CALL_TIMEOUT_S


@pytest.fixture
async def client() -> AsyncToolClient:
    """A client whose Redis is an in-process fake (nothing is listening at its URL)."""
    tool_client = AsyncToolClient("redis://127.0.0.1:9/0")
    tool_client._redis = fakeredis.aioredis.FakeRedis()
    tool_client._reader_redis = fakeredis.aioredis.FakeRedis()
    return tool_client


@pytest.mark.parametrize("timeout", [0, -1, MAX_CALL_TIMEOUT_S + 1])
async def test_a_timeout_the_workers_would_refuse_is_refused_at_once(client: AsyncToolClient, timeout: float) -> None:
    """A timeout the workers refuse (above a day, or not positive) raises before anything is enqueued."""
    with pytest.raises(ValueError, match="timeout"):
        await client.acall("anything", {}, timeout=timeout)
    assert await client._redis.llen("toolcalls") == 0
    await client.aclose()


async def test_a_failed_enqueue_leaves_nothing_waiting(client: AsyncToolClient) -> None:
    """Calls that could not be enqueued raise, and the client keeps no entry for them."""
    client._redis = fakeredis.aioredis.FakeRedis(connected=False)
    with pytest.raises(RedisConnectionError):
        await client.submit_many([("a", {}), ("b", {})], timeout=5)
    assert client._waiting == {}
    await client.aclose()


async def test_a_result_waited_for_in_vain_leaves_nothing_waiting(client: AsyncToolClient) -> None:
    """A wait for a result that times out raises TimeoutError and forgets the call."""
    [call_id] = await client.submit_many([("nobody_answers", {})], timeout=5)
    with pytest.raises(TimeoutError):
        await client.result(call_id, timeout=0.05)
    assert client._waiting == {}
    await client.aclose()
