"""The gateway's answer to a tenant over its max_queued: 429 with Retry-After, on REST and ToolServer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
import redis

from tests.support.gateway_stack import Stack, auth
from worker.constants import DEFAULT_TENANT, TENANT_LIMITS_KEY
from worker.gateway.calls import QUEUE_FULL_RETRY_AFTER_S
from worker.queue import scheduler

pytestmark = pytest.mark.integration

LIMIT = 3


@pytest.fixture
def full(gateway_stack: Stack) -> Iterator[Stack]:
    """The gateway's tenant (default) with max_queued 3 and, as counted, 3 calls waiting already."""
    r = redis.Redis.from_url(gateway_stack.redis.url)
    r.hset(TENANT_LIMITS_KEY, DEFAULT_TENANT, f"1 0 {LIMIT}")
    r.hincrby(scheduler.QUEUED_KEY, DEFAULT_TENANT, LIMIT)
    try:
        yield gateway_stack
    finally:
        r.hincrby(scheduler.QUEUED_KEY, DEFAULT_TENANT, -LIMIT)
        r.hdel(TENANT_LIMITS_KEY, DEFAULT_TENANT)
        r.close()


def test_rest_and_toolserver_answer_429_with_retry_after(full: Stack) -> None:
    """A call refused for its tenant's max_queued is a 429 with Retry-After naming tenant and limit; nothing queued."""
    body = {"tool": "echo_get", "arguments": {"item": "x"}}
    rest = httpx2.post(f"{full.url}/v1/calls", json=body, headers=auth(), timeout=30)
    assert rest.status_code == 429 and rest.headers["Retry-After"] == str(QUEUE_FULL_RETRY_AFTER_S)
    error = rest.json()["error"]
    assert error["type"] == "tenant_queue_full" and error["tenant"] == DEFAULT_TENANT and error["maxQueued"] == LIMIT
    legacy = {"tool_name": "echo_get", "arguments": {"item": "x"}}
    toolserver = httpx2.post(f"{full.url}/toolserver/execute_tool", json=legacy, headers=auth(), timeout=30)
    assert toolserver.status_code == 429 and toolserver.headers["Retry-After"] == str(QUEUE_FULL_RETRY_AFTER_S)
    assert "max_queued" in toolserver.json()["detail"]
    r = redis.Redis.from_url(full.redis.url)
    assert int(r.hget(scheduler.QUEUED_KEY, DEFAULT_TENANT) or 0) == LIMIT  # nothing more was counted (or pushed)
    r.close()
