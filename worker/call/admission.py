"""Whether and when a call may start: its deadline, its turn at the upstream (its arguments: arguments.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC

from worker import errors
from worker.call.fairness import FairTurns
from worker.call.runtime import TURNS_PER_CONNECTION
from worker.definitions.model import Upstream
from worker.protocol import ToolCall

# A call without a deadline waits this long at most for the shared rate limit.
MAX_RATE_WAIT_S = 300.0


def call_deadline(call: ToolCall, received_at: float) -> float:
    """The wall-clock time by which the call must be over (the earlier of deadline and timeout)."""
    limits = []
    if call.deadline is not None:
        at = call.deadline if call.deadline.tzinfo else call.deadline.replace(tzinfo=UTC)
        limits.append(at.timestamp())
    if call.timeout_s is not None:
        limits.append(received_at + call.timeout_s)
    deadline = min(limits, default=float("inf"))
    if deadline <= time.time():
        raise errors.DeadlineExceeded("The call's deadline passed before it could start; it was not sent.")
    return deadline


class Turn:
    """A call's place among the calls under way to its upstream: TURNS_PER_CONNECTION x max_concurrency
    of them per worker process. The others wait unprepared, each tenant's in order of arrival, the tenants
    by weighted round robin (`fairness.FairTurns`); a burst of thousands
    would otherwise render and start every request in one go, and hold the loop for a second or more
    while the upstream's answers waited to be read. A call gives its turn back while it sleeps between
    attempts (`pause`).

    Used as `async with turn:` around everything the call does at its upstream."""

    def __init__(self, turns: FairTurns, upstream: Upstream, deadline: float, tenant: str) -> None:
        self._turns, self._upstream, self._deadline, self._tenant = turns, upstream, deadline, tenant
        self._held = self._sent = False  # _sent: an earlier attempt had its turn

    async def __aenter__(self) -> Turn:
        await self.take()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.give_back()

    async def pause(self, sleep_s: float) -> None:
        """Sleep without the turn (another call may use it meanwhile), then take it again."""
        self.give_back()
        await asyncio.sleep(max(0.0, sleep_s))
        await self.take()

    async def take(self) -> None:
        if self._held:
            return
        if self._turns.locked():
            await self._wait()
        else:
            await self._turns.acquire(self._tenant)  # at once
        self._held = self._sent = True

    async def _wait(self) -> None:
        """As long as a free pooled connection was waited for (or, at a rate-limited upstream, a slot)."""
        upstream = self._upstream
        limited = upstream.rate_limit is not None
        # Never negative: a deadline that passed meanwhile leaves no time to wait, not less than none.
        wait_s = max(0.0, min(MAX_RATE_WAIT_S if limited else upstream.timeout_s, self._deadline - time.time()))
        try:
            async with asyncio.timeout(wait_s):
                await self._turns.acquire(self._tenant)
        except TimeoutError:
            error = errors.DeadlineExceeded if limited else errors.TimedOut
            raise error(
                f"The call waited {wait_s:.3g} seconds for its turn at the upstream, which had "
                f"{TURNS_PER_CONNECTION * upstream.max_concurrency} calls under way; "
                f"it was not sent{' again' if self._sent else ''}."
            ) from None

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._turns.release()
