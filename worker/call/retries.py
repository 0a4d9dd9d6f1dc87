"""Attempts again after a failure worth retrying: exponential backoff with full jitter, Retry-After."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from worker import errors
from worker.call.admission import Turn
from worker.call.attempt import Attempt
from worker.definitions.model import IDEMPOTENT_METHODS
from worker.http.retry_after import parse_retry_after
from worker.http.transport import Limits, Response

# A Retry-After longer than this is not waited for (the non-2xx answer is returned).
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class Tried:
    """The last attempt's response, or the failure that ended the attempts; how many were made."""

    response: Response | None
    error: errors.ToolError | None
    attempts: int


async def send_with_retries(attempt: Attempt, turn: Turn, max_bytes: int) -> Tried:
    """Idempotent methods (and unsafe ones where the upstream opts in) are tried up to `retry.attempts`
    times on a retryable transport failure or a listed status. The call holds its turn throughout, but
    while it waits to try again."""
    upstream, request, deadline = attempt.upstream, attempt.request, attempt.deadline
    policy = upstream.retry
    may_retry = request.method in IDEMPOTENT_METHODS or policy.unsafe_methods
    attempts = policy.attempts if may_retry else 1
    limits = Limits(max_bytes, upstream.connect_timeout_s)
    for number in range(1, attempts + 1):
        try:
            response = await attempt.send(limits, number)
        except errors.TransportError as exc:
            if number == attempts or not exc.retryable:
                return Tried(None, exc, number)
            wait_s = backoff_s(policy.backoff_s, policy.max_backoff_s, number)
        except errors.ToolError as exc:  # refused before sending (circuit, rate limit, time): not retried
            return Tried(None, exc, number)
        else:
            if number == attempts or response.status not in policy.statuses:
                return Tried(response, None, number)
            asked_s = parse_retry_after(response.retry_after, time.time())
            if asked_s is not None and (asked_s > MAX_RETRY_AFTER_S or time.time() + asked_s >= deadline):
                return Tried(response, None, number)  # the upstream asks for more time than the call has
            wait_s = asked_s if asked_s is not None else backoff_s(policy.backoff_s, policy.max_backoff_s, number)
        try:
            await turn.pause(min(wait_s, deadline - time.time()))
        except errors.ToolError as exc:  # no turn came back in time
            return Tried(None, exc, number)
    raise AssertionError("unreachable: the last attempt returns")


def backoff_s(base_s: float, cap_s: float, attempt: int) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap_s, base_s * 2 ** (attempt - 1)))
