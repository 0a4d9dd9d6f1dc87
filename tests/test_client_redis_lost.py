"""A call already waiting when Redis goes away: the caller's wait ends at its timeout plus CLIENT_SLACK_S,
with an error that names Redis (RedisLost; the CLI exits 69); a Redis back in time finishes the call."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from tests.support.waiting import Budget, scaled
from worker import AsyncToolClient, RedisLost, ToolClient
from worker.constants import CLIENT_SLACK_S, DEFAULT_QUEUE
from worker.dev.embedded import EmbeddedRedis

pytestmark = pytest.mark.integration

TIMEOUT_S = 4.0
# Room for process start-up and a loaded machine; still far below the minute a lost Redis used to cost.
MARGIN_S = 8.0


@pytest.fixture
def doomed_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A server of this test's own, to be killed."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    yield server
    server.stop()


def take_enqueued(url: str) -> dict[str, object]:
    """Wait for the client's call message on the queue (BLPOP: no worker there to take it) and return it."""
    budget, taken = Budget(30), None
    with redis.Redis.from_url(url) as client:
        while taken is None and not budget.exhausted():  # a client process starts slowly on a busy machine
            taken = client.blpop([DEFAULT_QUEUE], timeout=1)
    assert taken is not None, "the call was never enqueued"
    message: dict[str, object] = json.loads(taken[1])
    return message


def kill(server: EmbeddedRedis) -> None:
    assert server.process is not None
    server.process.kill()
    server.process.wait()


def test_sync_call_waiting_when_redis_dies_raises_redis_lost_within_its_timeout(doomed_redis: EmbeddedRedis) -> None:
    """ToolClient.call(timeout=4) waiting when Redis is killed raises RedisLost naming Redis, after its
    timeout and within timeout + CLIENT_SLACK_S (+ margin), not after the old 34 s guard."""
    with ToolClient(doomed_redis.url) as client, ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        waiting = pool.submit(client.call, "echo_get", {"item": "x"}, timeout=TIMEOUT_S)
        take_enqueued(doomed_redis.url)
        kill(doomed_redis)
        with pytest.raises(RedisLost, match=rf"lost Redis at redis://127\.0\.0\.1:{doomed_redis.port}/0"):
            waiting.result(timeout=60)
        elapsed_s = time.monotonic() - started
    assert TIMEOUT_S <= elapsed_s < TIMEOUT_S + CLIENT_SLACK_S + MARGIN_S, elapsed_s


async def test_async_call_waiting_when_redis_dies_raises_redis_lost_within_its_timeout(
    doomed_redis: EmbeddedRedis,
) -> None:
    """AsyncToolClient.acall(timeout=4) waiting when Redis is killed raises RedisLost (also a TimeoutError
    and a ConnectionError) after its timeout and within timeout + CLIENT_SLACK_S (+ margin), not after 80 s."""
    client = AsyncToolClient(doomed_redis.url)
    try:
        started = time.monotonic()
        waiting = asyncio.create_task(client.acall("echo_get", {"item": "x"}, timeout=TIMEOUT_S))
        await asyncio.to_thread(take_enqueued, doomed_redis.url)
        kill(doomed_redis)
        with pytest.raises(RedisLost, match="lost Redis at") as raised:
            await asyncio.wait_for(waiting, 60)
        elapsed_s = time.monotonic() - started
    finally:
        await client.aclose()
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, ConnectionError)
    assert TIMEOUT_S <= elapsed_s < TIMEOUT_S + CLIENT_SLACK_S + MARGIN_S, elapsed_s


def test_cli_call_waiting_when_redis_dies_exits_69_naming_redis(doomed_redis: EmbeddedRedis) -> None:
    """`toolworker call --timeout 4` waiting when Redis is killed exits 69 within timeout + slack (+ margin)
    with the reason on stderr (Redis, its address) and no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env["TOOLWORKER_REDIS_URL"] = doomed_redis.url
    argv = [sys.executable, "-m", "worker", "call", "echo_get", "--arg", "item=x", "--timeout", str(TIMEOUT_S)]
    started = time.monotonic()
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        try:  # leaving the block closes the pipes, also when the test fails before reading them
            take_enqueued(doomed_redis.url)
            kill(doomed_redis)
            stdout, stderr = process.communicate(timeout=60)
        finally:
            process.kill()
    elapsed_s = time.monotonic() - started
    text = stderr.decode()
    assert process.returncode == 69, (process.returncode, text)
    assert f"lost Redis at redis://127.0.0.1:{doomed_redis.port}/0" in text
    assert "Traceback" not in text and stdout == b""
    assert elapsed_s < TIMEOUT_S + CLIENT_SLACK_S + scaled(MARGIN_S), elapsed_s  # start-up slows with the load


async def test_a_call_whose_redis_comes_back_in_time_is_answered(doomed_redis: EmbeddedRedis, tmp_path: Path) -> None:
    """Redis killed and started again on the same port while a call waits: the reply stream is read again
    and the envelope published there afterwards (as a worker would) is the call's result."""
    client = AsyncToolClient(doomed_redis.url)
    try:
        waiting = asyncio.create_task(client.acall("echo_get", {"item": "x"}, timeout=30))
        message = await asyncio.to_thread(take_enqueued, doomed_redis.url)
        kill(doomed_redis)
        revived = EmbeddedRedis(tmp_path / "revived", port=doomed_redis.port).start()
        try:
            call_id = message["headers"]["id"]  # type: ignore[index]
            envelope = {"callId": call_id, "tool": "echo_get", "result": "back", "exitCode": 0, "statusCode": 200}
            with redis.Redis.from_url(revived.url) as direct:
                direct.xadd(client.reply_stream, {"envelope": json.dumps(envelope)})
            result = await asyncio.wait_for(waiting, 60)
        finally:
            revived.stop()
    finally:
        await client.aclose()
    assert (result.call_id, result.exit_code, result.result) == (call_id, 0, "back")
