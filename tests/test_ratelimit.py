"""The shared rate limit (GCRA in Lua): fakeredis for the arithmetic, a real server for the Lua dialect."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import fakeredis
import pytest
import redis.asyncio as aioredis

from tests.support.waiting import scaled
from worker import errors
from worker.call.ratelimit import _reserve, acquire
from worker.constants import RATE_LIMIT_KEY_PREFIX
from worker.dev.embedded import EmbeddedRedis

NAME = "test"
KEY = RATE_LIMIT_KEY_PREFIX + NAME
# Slack for the real time that passes between two calls of one test.
SLACK_US = 50_000


@pytest.fixture
def fake_server() -> fakeredis.FakeServer:
    pytest.importorskip("lupa", reason="fakeredis runs Lua scripts only with lupa installed (fakeredis[lua])")
    return fakeredis.FakeServer()


@pytest.fixture
async def fake(fake_server: fakeredis.FakeServer) -> AsyncIterator[aioredis.Redis]:
    client = fakeredis.FakeAsyncRedis(server=fake_server)
    yield client
    await client.aclose()


@dataclass(frozen=True)
class Reserved:
    """A reservation's wait (µs), and the monotonic instants between which the server read its clock."""

    wait_us: int
    start: float
    end: float

    def shortened(self, expected_us: int, first: Reserved) -> bool:
        """The wait is `expected_us` as at `first`'s instant, less the real time between the two reservations
        (known between two bounds: on a busy machine a reservation may take a while to be made)."""
        least_us, most_us = (self.start - first.end) * 1e6, (self.end - first.start) * 1e6
        return max(0, expected_us - most_us) - SLACK_US <= self.wait_us <= max(0, expected_us - least_us) + SLACK_US


async def reserve(client: aioredis.Redis, rate_per_s: float, burst: int) -> Reserved:
    start = time.monotonic()
    _, wait_us = await _reserve(client, KEY, round(1_000_000 / rate_per_s), burst, -1)
    return Reserved(wait_us, start, time.monotonic())


async def waits(client: aioredis.Redis, count: int, rate_per_s: float, burst: int) -> list[Reserved]:
    """The reservations of `count` calls made one after another."""
    return [await reserve(client, rate_per_s, burst) for _ in range(count)]


async def test_burst_goes_at_once_then_calls_are_spaced(fake: aioredis.Redis) -> None:
    """`burst` calls go at once; each further call waits one more interval (1/rate)."""
    got = await waits(fake, 6, rate_per_s=1, burst=3)
    expected = [0, 0, 0, 1_000_000, 2_000_000, 3_000_000]
    assert all(r.shortened(e, got[0]) for r, e in zip(got, expected, strict=True)), got


async def test_burst_of_one_spaces_every_call(fake: aioredis.Redis) -> None:
    """With burst 1 only the first call is free."""
    got = await waits(fake, 3, rate_per_s=10, burst=1)
    assert got[0].wait_us == 0
    assert got[1].shortened(100_000, got[0]) and got[2].shortened(200_000, got[0]), got


async def test_acquire_within_burst_does_not_wait(fake: aioredis.Redis) -> None:
    """Calls inside the burst return at once."""
    started = time.perf_counter()
    for _ in range(5):
        await acquire(fake, NAME, rate_per_s=1, burst=5, deadline=math.inf)
    assert time.perf_counter() - started < 0.5


async def test_acquire_sleeps_for_its_slot(fake: aioredis.Redis) -> None:
    """A call past the burst sleeps until its slot comes."""
    await acquire(fake, NAME, rate_per_s=5, burst=1, deadline=math.inf)
    started = time.perf_counter()
    await acquire(fake, NAME, rate_per_s=5, burst=1, deadline=time.time() + 10)
    assert 0.15 <= time.perf_counter() - started < 1.0


async def test_wait_past_deadline_raises_and_reserves_nothing(fake: aioredis.Redis) -> None:
    """A wait that would pass the deadline is exit 75 at once, and the refused call takes no slot."""
    first = await reserve(fake, rate_per_s=1, burst=1)
    started = time.perf_counter()
    with pytest.raises(errors.DeadlineExceeded) as info:
        await acquire(fake, NAME, rate_per_s=1, burst=1, deadline=time.time() + 0.5)
    assert time.perf_counter() - started < 0.3
    assert info.value.exit_code == 75
    assert "rate limit" in info.value.message and "deadline" in info.value.message
    # The next caller is second in line, not third.
    (second,) = await waits(fake, 1, rate_per_s=1, burst=1)
    assert second.shortened(1_000_000, first), (first, second)


async def test_passed_deadline_raises_even_when_free(fake: aioredis.Redis) -> None:
    """A call whose deadline has passed is refused without touching the limit."""
    with pytest.raises(errors.DeadlineExceeded, match="deadline passed"):
        await acquire(fake, NAME, rate_per_s=100, burst=10, deadline=time.time() - 1)
    assert await fake.exists(KEY) == 0


async def test_state_expires_when_idle(fake: aioredis.Redis) -> None:
    """The key lives only as long as it matters (until its TAT), so idle limits cost nothing."""
    await acquire(fake, NAME, rate_per_s=2, burst=1, deadline=math.inf)
    ttl_ms = await fake.pttl(KEY)
    assert 0 < ttl_ms <= 502


async def test_limit_is_shared_by_clients_of_one_server(
    fake: aioredis.Redis, fake_server: fakeredis.FakeServer
) -> None:
    """Two clients (two workers) draw from the same limit."""
    other = fakeredis.FakeAsyncRedis(server=fake_server)
    try:
        await acquire(fake, NAME, rate_per_s=1, burst=1, deadline=math.inf)
        with pytest.raises(errors.DeadlineExceeded):
            await acquire(other, NAME, rate_per_s=1, burst=1, deadline=time.time() + 0.5)
    finally:
        await other.aclose()


async def test_script_cache_flushed(fake: aioredis.Redis) -> None:
    """After SCRIPT FLUSH (or a server restart) the script is loaded again by itself."""
    await acquire(fake, NAME, rate_per_s=100, burst=5, deadline=math.inf)
    await fake.script_flush()
    await acquire(fake, NAME, rate_per_s=100, burst=5, deadline=math.inf)


@pytest.mark.parametrize(("rate_per_s", "burst"), [(0, 1), (-1, 1), (1, 0)])
async def test_invalid_limit(fake: aioredis.Redis, rate_per_s: float, burst: int) -> None:
    """A rate that is not positive or a burst under 1 is refused."""
    with pytest.raises(ValueError):
        await acquire(fake, NAME, rate_per_s, burst, math.inf)


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(Path(tmp_path_factory.mktemp("ratelimit-redis"))).start()
    yield server
    server.stop()


@pytest.mark.integration
async def test_real_server_spaces_concurrent_callers(real_server: EmbeddedRedis) -> None:
    """Against a real server (its Lua 5.1), 30 concurrent callers on two clients go out at the limit's pace."""
    clients = [aioredis.Redis.from_url(real_server.url) for _ in range(2)]
    name = f"{NAME}:real"
    key = RATE_LIMIT_KEY_PREFIX + name
    rate_per_s, burst = 50.0, 10
    try:
        started = time.monotonic()

        async def one(index: int) -> float:
            await acquire(clients[index % 2], name, rate_per_s, burst, deadline=time.time() + 10)
            return time.monotonic() - started

        done_at = sorted(await asyncio.gather(*(one(i) for i in range(30))))
        stored = await clients[0].get(key)
    finally:
        for client in clients:
            await client.aclose()
    assert stored is not None and stored.isdigit(), stored  # an exact integer, not 1.7e+15
    # The k-th call cannot go before (k - burst + 1) intervals; none is held much longer.
    for k, at in enumerate(done_at):
        assert at >= (k - burst + 1) / rate_per_s - 0.02, (k, at)
    assert done_at[-1] < (30 - burst) / rate_per_s + scaled(0.5)  # the slack: the event loop's turns
