"""A value the fleet shares through Redis and renews one worker at a time (single flight): the OAuth2 tokens
of an upstream (auth.py) and of a user (delegated.py), renewed once REFRESH_AT_SHARE of their lifetime has
passed while the others keep using the current one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis

from worker import errors
from worker.call.circuit import Clock

# A token is refreshed once this share of its lifetime has passed (workers keep using it meanwhile).
REFRESH_AT_SHARE = 0.8
# A token is sent only with this much of its life left (checked again after the call's waits, just before
# sending): the time the request takes to reach the upstream, and a clock that runs a little ahead there.
SEND_MARGIN_S = 0.5
_LOCK_MS = 15_000
_POLL_S = 0.05
T = TypeVar("T")


async def single_flight(
    redis: aioredis.Redis,
    lock_key: str,
    read: Callable[[], Awaitable[T | None]],
    fresh: Callable[[T], bool],
    usable: Callable[[T], bool],
    renew: Callable[[T | None], Awaitable[T]],
    deadline: float,
    clock: Clock = time.time,
) -> T:
    """A value shared by the fleet, renewed by one worker at a time (the holder of `lock_key`): fresh, it is
    used; stale, one worker renews it (after looking again under the lock) while the others keep using it if
    it is still usable, or wait for the new one within `deadline` (TimedOut past it)."""
    while True:
        current = await read()
        if current is not None and fresh(current):
            return current
        if await redis.set(lock_key, "1", nx=True, px=_LOCK_MS):
            try:
                current = await read()  # another worker may have renewed it since this one looked
                if current is not None and fresh(current):
                    return current
                return await renew(current)
            finally:
                await redis.delete(lock_key)
        if current is not None and usable(current):
            return current  # another worker is renewing it; this one is good meanwhile
        if clock() >= deadline:
            raise errors.TimedOut("The call ran out of time waiting for the upstream's access token.")
        await asyncio.sleep(_POLL_S)
