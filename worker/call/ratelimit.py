"""A rate limit that every worker shares through Redis: GCRA in one Lua script.

GCRA (the generic cell rate algorithm) keeps one number per limit, the theoretical arrival time (TAT)
of the next call. Each call reserves the next free slot in one round trip and sleeps until it comes,
so waiting callers go out evenly spaced instead of retrying in a herd. The script reads the clock of
the Redis server, so workers on machines whose clocks disagree still share one schedule.

(The `limits` package was considered: its strategies are windows, not GCRA, it reports no wait
time, and its asyncio storage builds its own connection from a URI instead of using ours.)
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from worker import errors
from worker.constants import RATE_LIMIT_KEY_PREFIX

_MICROS = 1_000_000
# KEYS[1]: the limit's TAT (microseconds on the server clock).
# ARGV: emission interval (µs), burst (calls allowed at once), longest acceptable wait (µs; -1: any).
# Returns {1, wait_µs} with the slot reserved, or {0, wait_µs} without reserving when the wait is too long.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local wait = tat - (tonumber(ARGV[2]) - 1) * interval - now
if wait < 0 then wait = 0 end
wait = math.floor(wait)
if max_wait >= 0 and wait > max_wait then return {0, wait} end
local new_tat = tat + interval
local ttl_ms = math.ceil((new_tat - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', string.format('%.0f', ttl_ms))
return {1, wait}
"""
_GCRA_SHA = hashlib.sha1(_GCRA.encode(), usedforsecurity=False).hexdigest()  # what EVALSHA names it by


async def acquire(
    redis: aioredis.Redis,
    name: str,
    rate_per_s: float,
    burst: int,
    deadline: float,
    key_prefix: str = RATE_LIMIT_KEY_PREFIX,
    whose: str = "The upstream's",
) -> None:
    """Wait for this call's slot under the limit `name` (an upstream's; a tenant's under its own key prefix);
    raise DeadlineExceeded (exit 75) if it comes after `deadline`.

    `deadline` is wall-clock epoch seconds (`math.inf` for none). A refused call reserves nothing.
    """
    if rate_per_s <= 0 or burst < 1:
        raise ValueError("rate_per_s must be positive and burst at least 1")
    interval_us = max(1, round(_MICROS / rate_per_s))
    remaining_s = deadline - time.time()
    if remaining_s < 0:
        raise _too_late(0.0, whose)
    max_wait_us = -1 if math.isinf(remaining_s) else math.floor(remaining_s * _MICROS)
    granted, wait_us = await _reserve(redis, key_prefix + name, interval_us, burst, max_wait_us)
    if not granted:
        raise _too_late(wait_us / _MICROS, whose)
    if wait_us > 0:
        await asyncio.sleep(wait_us / _MICROS)


async def _reserve(redis: aioredis.Redis, key: str, interval_us: int, burst: int, max_wait_us: int) -> tuple[bool, int]:
    args = (key, interval_us, burst, max_wait_us)
    reply: Any
    try:
        reply = await redis.evalsha(_GCRA_SHA, 1, *args)
    except NoScriptError:  # a fresh or restarted server: EVAL loads the script into its cache
        reply = await redis.eval(_GCRA, 1, *args)
    granted, wait_us = reply
    return int(granted) == 1, int(wait_us)


def _too_late(wait_s: float, whose: str) -> errors.DeadlineExceeded:
    if wait_s <= 0:
        return errors.DeadlineExceeded("The call's deadline passed before it could start; it was not sent.")
    return errors.DeadlineExceeded(
        f"{whose} rate limit would make this call wait {wait_s:.3g} s, past the call's deadline; "
        "it was not sent. Try again later or with a longer timeout."
    )
