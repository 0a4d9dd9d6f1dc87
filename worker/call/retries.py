"""Attempts again after a failure worth retrying: exponential backoff with full jitter, Retry-After."""

from __future__ import annotations

import asyncio
import random
import time

from worker import errors
from worker.call.attempt import Attempt
from worker.definitions.model import IDEMPOTENT_METHODS
from worker.envelope import ToolResult
from worker.http.retry_after import parse_retry_after
from worker.http.transport import Limits, Response

# A Retry-After longer than this is not waited for (the non-2xx answer is returned).
MAX_RETRY_AFTER_S = 60.0


async def send_with_retries(attempt: Attempt, envelope: ToolResult, max_bytes: int) -> Response:
    """Idempotent methods (and unsafe ones where the upstream opts in) are tried up to `retry.attempts`
    times on a retryable transport failure or a listed status; the envelope counts the attempts."""
    upstream, request, deadline = attempt.upstream, attempt.request, attempt.deadline
    policy = upstream.retry
    may_retry = request.method in IDEMPOTENT_METHODS or policy.unsafe_methods
    attempts = policy.attempts if may_retry else 1
    limits = Limits(max_bytes, upstream.connect_timeout_s)
    for number in range(1, attempts + 1):
        envelope.attempts = number
        try:
            response = await attempt.send(limits, number)
        except errors.TransportError as exc:
            if number == attempts or not exc.retryable:
                raise
        else:
            if number == attempts or response.status not in policy.statuses:
                return response
            asked_s = parse_retry_after(response.retry_after, time.time())
            if asked_s is not None:
                if asked_s > MAX_RETRY_AFTER_S or time.time() + asked_s >= deadline:
                    return response  # the upstream asks for more time than the call has: its answer stands
                attempt.turn.give_back()
                await asyncio.sleep(asked_s)
                continue
        attempt.turn.give_back()
        await asyncio.sleep(min(backoff_s(policy.backoff_s, policy.max_backoff_s, number), deadline - time.time()))
    raise AssertionError("unreachable: the last attempt returns or raises")


def backoff_s(base_s: float, cap_s: float, attempt: int) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap_s, base_s * 2 ** (attempt - 1)))
