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

# A token is refreshed once this share of its lifetime has passed (workers keep using it meanwhile, up to
# its send margin).
REFRESH_AT_SHARE = 0.8
# A token is sent only with a margin of its life left (checked again after the call's waits, just before
# sending): the time the request takes to reach the upstream (on a loaded host, a stall of a second
# between the check and the upstream's own), and a clock that runs a little ahead there. The margin is a
# share of the token's lifetime, at least SEND_MARGIN_S and at most MAX_SEND_MARGIN_S: an hour's token is
# not sent in its last minute, a five-second one not in its last second. For tokens that live under five
# minutes it reaches the refresh point: calls then wait for the renewal rather than send the old token.
SEND_MARGIN_S = 0.5
SEND_MARGIN_SHARE = 1 - REFRESH_AT_SHARE
MAX_SEND_MARGIN_S = 60.0
_LOCK_MS = 15_000
_POLL_S = 0.05
T = TypeVar("T")


def send_by(obtained_at: float, expires_at: float) -> float:
    """The last moment a token may be sent: its expiry less its send margin (SEND_MARGIN_S alone when it is
    not known when the token was obtained)."""
    lifetime_s = expires_at - obtained_at if obtained_at else 0.0
    return expires_at - min(MAX_SEND_MARGIN_S, max(SEND_MARGIN_S, SEND_MARGIN_SHARE * lifetime_s))


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
